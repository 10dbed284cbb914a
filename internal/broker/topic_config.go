package broker

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
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

// CleanupPolicy is a topic's cleanup.policy.
type CleanupPolicy string

// Cleanup policies. A topic may have both: its old segments are deleted
// by retention and the rest compacted.
const (
	CleanupDelete        CleanupPolicy = "delete"
	CleanupCompact       CleanupPolicy = "compact"
	CleanupDeleteCompact CleanupPolicy = "delete,compact"
)

// ParseCleanupPolicy reads cleanup.policy as Kafka writes it: delete,
// compact, or a comma-separated list of both in either order.
func ParseCleanupPolicy(s string) (CleanupPolicy, error) {
	var del, compact bool
	for _, v := range strings.Split(s, ",") {
		switch strings.TrimSpace(v) {
		case string(CleanupDelete):
			del = true
		case string(CleanupCompact):
			compact = true
		default:
			return "", fmt.Errorf("%w: cleanup.policy %q: want delete, compact or both (delete,compact)", ErrInvalidConfig, s)
		}
	}
	switch {
	case del && compact:
		return CleanupDeleteCompact, nil
	case compact:
		return CleanupCompact, nil
	}
	return CleanupDelete, nil
}

// Deletes reports whether retention deletes old segments under p.
func (p CleanupPolicy) Deletes() bool { return p == CleanupDelete || p == CleanupDeleteCompact }

// Compacts reports whether p compacts: keys are required and only the
// newest record per key is kept.
func (p CleanupPolicy) Compacts() bool { return p == CleanupCompact || p == CleanupDeleteCompact }

// TopicConfig holds per-topic settings, named after Kafka's topic configs.
// Zero fields take the defaults documented on each.
type TopicConfig struct {
	// Partitions is the partition count (default Options.DefaultPartitions).
	Partitions int32 `json:"partitions"`
	// RetentionMs deletes segments whose newest record is older (default 7
	// days; -1 keeps forever).
	RetentionMs int64 `json:"retention_ms"`
	// RetentionBytes caps each partition's size (default -1, unlimited).
	RetentionBytes int64 `json:"retention_bytes"`
	// CleanupPolicy is delete (default), compact, or both.
	CleanupPolicy CleanupPolicy `json:"cleanup_policy"`
	// SegmentBytes rolls the active segment at this size (default 1 GiB,
	// at most 2 GiB because index positions are 32-bit).
	SegmentBytes int64 `json:"segment_bytes"`
	// SegmentMs rolls the active segment at this age (default 7 days).
	SegmentMs int64 `json:"segment_ms"`
	// DeleteRetentionMs keeps tombstones on compacted topics at least this
	// long after their timestamp (default 1 day).
	DeleteRetentionMs int64 `json:"delete_retention_ms"`
	// MinCompactionLagMs keeps a record out of compaction until it is at
	// least this old: compaction cleans only the inactive segments whose
	// newest record is older (default 0).
	MinCompactionLagMs int64 `json:"min_compaction_lag_ms,omitempty"`
	// MaxMessageBytes is the largest batch accepted (default 1 MiB + 12).
	MaxMessageBytes int32 `json:"max_message_bytes"`
}

// withDefaults fills zero fields.
func (c TopicConfig) withDefaults(defaultPartitions int32) TopicConfig {
	if c.Partitions == 0 {
		c.Partitions = defaultPartitions
	}
	if c.RetentionMs == 0 {
		c.RetentionMs = 7 * 24 * 3600 * 1000
	}
	if c.RetentionBytes == 0 {
		c.RetentionBytes = -1
	}
	if c.CleanupPolicy == "" {
		c.CleanupPolicy = CleanupDelete
	}
	if c.SegmentBytes == 0 {
		c.SegmentBytes = 1 << 30
	}
	if c.SegmentMs == 0 {
		c.SegmentMs = 7 * 24 * 3600 * 1000
	}
	if c.DeleteRetentionMs == 0 {
		c.DeleteRetentionMs = 24 * 3600 * 1000
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = 1<<20 + 12
	}
	return c
}

func (c TopicConfig) validate() error {
	switch {
	case c.Partitions < 1 || c.Partitions > 100000:
		return fmt.Errorf("%w: partitions %d", ErrInvalidConfig, c.Partitions)
	case !c.CleanupPolicy.Deletes() && !c.CleanupPolicy.Compacts():
		return fmt.Errorf("%w: cleanup policy %q", ErrInvalidConfig, c.CleanupPolicy)
	case c.SegmentBytes < 1024 || c.SegmentBytes > 1<<31-1:
		return fmt.Errorf("%w: segment bytes %d", ErrInvalidConfig, c.SegmentBytes)
	case c.MaxMessageBytes < BatchHeaderSize:
		return fmt.Errorf("%w: max message bytes %d", ErrInvalidConfig, c.MaxMessageBytes)
	case c.SegmentMs < 0 || c.DeleteRetentionMs < 0 || c.MinCompactionLagMs < 0:
		return fmt.Errorf("%w: negative segment.ms, delete.retention.ms or min.compaction.lag.ms", ErrInvalidConfig)
	case c.RetentionMs < -1 || c.RetentionBytes < -1:
		return fmt.Errorf("%w: retention.ms and retention.bytes are -1 (unlimited) or positive", ErrInvalidConfig)
	}
	return nil
}

// ValidateTopicConfig reports whether cfg (zero fields taking the
// defaults) is a configuration CreateTopic or AlterTopicConfig accepts.
func (b *Broker) ValidateTopicConfig(cfg TopicConfig) error { return b.fillTopicConfig(cfg).validate() }

// DefaultTopicConfig is the configuration a topic created without any
// takes.
func (b *Broker) DefaultTopicConfig() TopicConfig { return b.fillTopicConfig(TopicConfig{}) }

func (b *Broker) fillTopicConfig(cfg TopicConfig) TopicConfig {
	d := b.opts.DefaultTopicConfig
	if p := b.defaults.Load(); p != nil {
		d = *p
	}
	return fillFrom(cfg, d, b.opts.DefaultPartitions)
}

// CheckTopicConfig reports whether cfg, its zero fields taken from
// defaults and then from the built-in defaults, is a valid configuration.
func CheckTopicConfig(cfg, defaults TopicConfig) error {
	return fillFrom(cfg, defaults, 1).validate()
}

func fillFrom(cfg, d TopicConfig, defaultPartitions int32) TopicConfig {
	// Each zero field takes the broker's default.
	cfg.Partitions = cmp.Or(cfg.Partitions, d.Partitions)
	cfg.RetentionMs = cmp.Or(cfg.RetentionMs, d.RetentionMs)
	cfg.RetentionBytes = cmp.Or(cfg.RetentionBytes, d.RetentionBytes)
	cfg.CleanupPolicy = cmp.Or(cfg.CleanupPolicy, d.CleanupPolicy)
	cfg.SegmentBytes = cmp.Or(cfg.SegmentBytes, d.SegmentBytes)
	cfg.SegmentMs = cmp.Or(cfg.SegmentMs, d.SegmentMs)
	cfg.DeleteRetentionMs = cmp.Or(cfg.DeleteRetentionMs, d.DeleteRetentionMs)
	cfg.MinCompactionLagMs = cmp.Or(cfg.MinCompactionLagMs, d.MinCompactionLagMs)
	cfg.MaxMessageBytes = cmp.Or(cfg.MaxMessageBytes, d.MaxMessageBytes)
	return cfg.withDefaults(defaultPartitions)
}
