package protocol

import (
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// The topic configs the embedded broker keeps (broker.TopicConfigNames),
// by their Kafka names: what CreateTopics accepts and DescribeConfigs,
// AlterConfigs and IncrementalAlterConfigs show and change.

func configType(k broker.TopicConfigKind) kmsg.ConfigType {
	switch k {
	case broker.KindInt:
		return kmsg.ConfigTypeInt
	case broker.KindList:
		return kmsg.ConfigTypeList
	}
	return kmsg.ConfigTypeLong
}

// setTopicConfig sets the named config of c from its Kafka string form.
func setTopicConfig(c *broker.TopicConfig, name, value string) error {
	return broker.SetTopicConfig(c, name, value)
}

type topicConfigEntry struct {
	name, value string
	ctype       kmsg.ConfigType
}

// topicConfigDocs describe the topic configs, for DescribeConfigs v3+
// requests that include documentation.
var topicConfigDocs = map[string]string{
	"cleanup.policy":        "delete (drop old segments by time and size), compact (keep each key's latest record), or both.",
	"retention.ms":          "How long a segment is kept once closed, in milliseconds; -1 keeps segments by time forever.",
	"retention.bytes":       "The largest a partition may grow before its oldest segments are dropped; -1 for no limit.",
	"segment.bytes":         "The size at which a partition's active segment is closed and a new one started.",
	"segment.ms":            "The age at which a partition's active segment is closed even when not full, in milliseconds.",
	"delete.retention.ms":   "How long a compacted topic keeps a tombstone (a null value) after compaction reached it, in milliseconds.",
	"min.compaction.lag.ms": "The least time a record stays uncompacted after it was written, in milliseconds.",
	"max.message.bytes":     "The largest record batch a producer may append to the topic, in bytes.",
}

// topicConfigEntries are c's configs in Kafka's names and string forms.
func topicConfigEntries(c broker.TopicConfig) []topicConfigEntry {
	out := make([]topicConfigEntry, 0, len(broker.TopicConfigNames))
	for _, f := range broker.TopicConfigNames {
		out = append(out, topicConfigEntry{name: f.Name, value: f.Get(c), ctype: configType(f.Kind)})
	}
	return out
}
