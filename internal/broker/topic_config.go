package broker

import (
	"fmt"
	"strconv"
)

// TopicConfigKind is how a topic config's value is written: Kafka's
// config types.
type TopicConfigKind int

// Kinds of topic configs.
const (
	KindLong TopicConfigKind = iota
	KindInt
	KindList
)

// TopicConfigName is one topic config by its Kafka name: the table that
// the Kafka listener (CreateTopics, DescribeConfigs, AlterConfigs), the
// configuration file and `relay topics` share.
type TopicConfigName struct {
	Name string
	Kind TopicConfigKind
	// Duration says the value is in milliseconds.
	Duration bool
	// Get is c's value in Kafka's string form.
	Get func(c TopicConfig) string
	// Set parses v into c (not validated against the other fields: see
	// Broker.ValidateTopicConfig).
	Set func(c *TopicConfig, v string) error
}

func int64Config(name string, kind TopicConfigKind, duration bool, field func(*TopicConfig) *int64) TopicConfigName {
	bits := 64
	if kind == KindInt {
		bits = 32
	}
	return TopicConfigName{
		Name:     name,
		Kind:     kind,
		Duration: duration,
		Get:      func(c TopicConfig) string { return strconv.FormatInt(*field(&c), 10) },
		Set: func(c *TopicConfig, v string) error {
			n, err := strconv.ParseInt(v, 10, bits)
			if err != nil {
				return fmt.Errorf("%w: %s=%q is not a %d-bit integer", ErrInvalidConfig, name, v, bits)
			}
			*field(c) = n
			return nil
		},
	}
}

// TopicConfigNames lists the topic configs the broker keeps.
var TopicConfigNames = []TopicConfigName{
	{
		Name: "cleanup.policy",
		Kind: KindList,
		Get:  func(c TopicConfig) string { return string(c.CleanupPolicy) },
		Set: func(c *TopicConfig, v string) error {
			p, err := ParseCleanupPolicy(v)
			c.CleanupPolicy = p
			return err
		},
	},
	int64Config("retention.ms", KindLong, true, func(c *TopicConfig) *int64 { return &c.RetentionMs }),
	int64Config("retention.bytes", KindLong, false, func(c *TopicConfig) *int64 { return &c.RetentionBytes }),
	int64Config("segment.bytes", KindInt, false, func(c *TopicConfig) *int64 { return &c.SegmentBytes }),
	int64Config("segment.ms", KindLong, true, func(c *TopicConfig) *int64 { return &c.SegmentMs }),
	int64Config("delete.retention.ms", KindLong, true, func(c *TopicConfig) *int64 { return &c.DeleteRetentionMs }),
	int64Config("min.compaction.lag.ms", KindLong, true, func(c *TopicConfig) *int64 { return &c.MinCompactionLagMs }),
	{
		Name: "max.message.bytes",
		Kind: KindInt,
		Get:  func(c TopicConfig) string { return strconv.FormatInt(int64(c.MaxMessageBytes), 10) },
		Set: func(c *TopicConfig, v string) error {
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil {
				return fmt.Errorf("%w: max.message.bytes=%q is not a 32-bit integer", ErrInvalidConfig, v)
			}
			c.MaxMessageBytes = int32(n)
			return nil
		},
	},
}

// FindTopicConfig returns the topic config called name.
func FindTopicConfig(name string) (TopicConfigName, bool) {
	for _, f := range TopicConfigNames {
		if f.Name == name {
			return f, true
		}
	}
	return TopicConfigName{}, false
}

// SetTopicConfig sets the config called name of c from its Kafka string
// form.
func SetTopicConfig(c *TopicConfig, name, value string) error {
	f, ok := FindTopicConfig(name)
	if !ok {
		return fmt.Errorf("%w: config %s is not supported", ErrInvalidConfig, name)
	}
	return f.Set(c, value)
}
