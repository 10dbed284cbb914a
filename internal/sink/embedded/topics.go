package embedded

import (
	"errors"
	"fmt"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/relay"
)

// createTopics creates the topics of msgs that the broker does not have
// yet in one call (broker.EnsureTopics), so that a batch spread over many
// new topics does not create them one after another, a few fsyncs each.
// Failures are left to topicConfig, which reports them per message.
func (s *Sink) createTopics(b *broker.Broker, msgs []relay.Message) {
	if v := b.ConfigVersion(); v != s.topicsVersion {
		s.topics, s.topicsVersion = map[string]broker.TopicConfig{}, v
	}
	var missing []string
	seen := map[string]bool{}
	for _, m := range msgs {
		if _, ok := s.topics[m.Topic]; ok || seen[m.Topic] {
			continue
		}
		seen[m.Topic] = true
		if _, err := b.TopicConfig(m.Topic); err != nil {
			missing = append(missing, m.Topic)
		}
	}
	if len(missing) > 1 {
		_ = b.EnsureTopics(missing)
	}
}

// topicConfig returns a topic's settings, creating the topic on first use
// unless WaitForTopics is set; then a missing topic is a
// relay.DestinationError, asked about again at the next call.
func (s *Sink) topicConfig(b *broker.Broker, topic string) (broker.TopicConfig, error) {
	if v := b.ConfigVersion(); v != s.topicsVersion {
		// A topic was created, altered, repartitioned or deleted.
		s.topics, s.topicsVersion = map[string]broker.TopicConfig{}, v
	}
	if cfg, ok := s.topics[topic]; ok {
		return cfg, nil
	}
	// Asked first without creating: a whole description (EnsureTopic's
	// answer) costs a lock and an allocation per partition, which at
	// thousands of topics showed in the first batches after a start.
	cfg, err := b.TopicConfig(topic)
	if s.cfg.WaitForTopics {
		if errors.Is(err, broker.ErrUnknownTopicOrPartition) {
			if verr := broker.ValidateTopicName(topic); verr != nil {
				return broker.TopicConfig{}, verr
			}
			return broker.TopicConfig{}, &relay.DestinationError{Topic: topic, Reason: relay.WaitTopicMissing,
				Err: fmt.Errorf("embedded sink: topic %s does not exist and topics are not created on first use (--create-topics=false); its events wait in the outbox until it is created", topic)}
		}
	} else if err != nil {
		var info broker.TopicInfo
		info, err = b.EnsureTopic(topic)
		cfg = info.Config
	}
	if errors.Is(err, broker.ErrRecentlyDeleted) {
		// The name can be used again once the broker reopened: the next
		// session opens it anew instead of keeping it.
		s.mu.Lock()
		s.reopen = true
		s.mu.Unlock()
	}
	if err != nil {
		return broker.TopicConfig{}, err
	}
	s.topics[topic] = cfg
	return cfg, nil
}

// admissible checks what the broker would refuse for this message alone: a
// keyless record on a compacted topic, or a record whose batch is over the
// topic's size limit.
func admissible(m relay.Message, cfg broker.TopicConfig) error {
	if m.Key == nil && cfg.CleanupPolicy.Compacts() {
		return broker.ErrKeylessCompacted
	}
	// A cheap upper bound first (every varint at its longest); encode only
	// when the bound is over the limit.
	bound := broker.BatchHeaderSize + 7*10 + len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		bound += 20 + len(h.Key) + len(h.Value)
	}
	if bound <= int(cfg.MaxMessageBytes) {
		return nil
	}
	if n := len(broker.EncodeBatch(0, 0, 0, []broker.Record{toRecord(m)})); n > int(cfg.MaxMessageBytes) {
		return fmt.Errorf("%w: a %d-byte batch, the topic's limit is %d", broker.ErrMessageTooLarge, n, cfg.MaxMessageBytes)
	}
	return nil
}
