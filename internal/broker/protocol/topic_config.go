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

// topicConfigEntries are c's configs in Kafka's names and string forms.
func topicConfigEntries(c broker.TopicConfig) []topicConfigEntry {
	out := make([]topicConfigEntry, 0, len(broker.TopicConfigNames))
	for _, f := range broker.TopicConfigNames {
		out = append(out, topicConfigEntry{name: f.Name, value: f.Get(c), ctype: configType(f.Kind)})
	}
	return out
}
