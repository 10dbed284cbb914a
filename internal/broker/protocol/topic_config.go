package protocol

import (
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// The topic configs the embedded broker keeps, by their Kafka names: what
// CreateTopics accepts and DescribeConfigs, AlterConfigs and
// IncrementalAlterConfigs show and change.

type topicConfigField struct {
	name  string
	ctype kmsg.ConfigType
	get   func(broker.TopicConfig) string
	set   func(c *broker.TopicConfig, v string) error
}

func int64Field(name string, ctype kmsg.ConfigType, bits int, field func(*broker.TopicConfig) *int64) topicConfigField {
	return topicConfigField{
		name:  name,
		ctype: ctype,
		get:   func(c broker.TopicConfig) string { return strconv.FormatInt(*field(&c), 10) },
		set: func(c *broker.TopicConfig, v string) error {
			n, err := strconv.ParseInt(v, 10, bits)
			if err != nil {
				return fmt.Errorf("config %s=%q: %w", name, v, err)
			}
			*field(c) = n
			return nil
		},
	}
}

var topicConfigFields = []topicConfigField{
	{
		name:  "cleanup.policy",
		ctype: kmsg.ConfigTypeList,
		get:   func(c broker.TopicConfig) string { return string(c.CleanupPolicy) },
		set: func(c *broker.TopicConfig, v string) error {
			switch v {
			case string(broker.CleanupDelete), string(broker.CleanupCompact):
				c.CleanupPolicy = broker.CleanupPolicy(v)
				return nil
			}
			return fmt.Errorf("config cleanup.policy=%q: want delete or compact", v)
		},
	},
	int64Field("retention.ms", kmsg.ConfigTypeLong, 64, func(c *broker.TopicConfig) *int64 { return &c.RetentionMs }),
	int64Field("retention.bytes", kmsg.ConfigTypeLong, 64, func(c *broker.TopicConfig) *int64 { return &c.RetentionBytes }),
	int64Field("segment.bytes", kmsg.ConfigTypeInt, 32, func(c *broker.TopicConfig) *int64 { return &c.SegmentBytes }),
	int64Field("segment.ms", kmsg.ConfigTypeLong, 64, func(c *broker.TopicConfig) *int64 { return &c.SegmentMs }),
	int64Field("delete.retention.ms", kmsg.ConfigTypeLong, 64, func(c *broker.TopicConfig) *int64 { return &c.DeleteRetentionMs }),
	{
		name:  "max.message.bytes",
		ctype: kmsg.ConfigTypeInt,
		get:   func(c broker.TopicConfig) string { return strconv.FormatInt(int64(c.MaxMessageBytes), 10) },
		set: func(c *broker.TopicConfig, v string) error {
			n, err := strconv.ParseInt(v, 10, 32)
			if err != nil {
				return fmt.Errorf("config max.message.bytes=%q: %w", v, err)
			}
			c.MaxMessageBytes = int32(n)
			return nil
		},
	},
}

func findTopicConfigField(name string) (topicConfigField, bool) {
	for _, f := range topicConfigFields {
		if f.name == name {
			return f, true
		}
	}
	return topicConfigField{}, false
}

// setTopicConfig sets the named config of c from its Kafka string form.
func setTopicConfig(c *broker.TopicConfig, name, value string) error {
	f, ok := findTopicConfigField(name)
	if !ok {
		return fmt.Errorf("config %s is not supported", name)
	}
	return f.set(c, value)
}

type topicConfigEntry struct {
	name, value string
	ctype       kmsg.ConfigType
}

// topicConfigEntries are c's configs in Kafka's names and string forms.
func topicConfigEntries(c broker.TopicConfig) []topicConfigEntry {
	out := make([]topicConfigEntry, 0, len(topicConfigFields))
	for _, f := range topicConfigFields {
		out = append(out, topicConfigEntry{name: f.name, value: f.get(c), ctype: f.ctype})
	}
	return out
}
