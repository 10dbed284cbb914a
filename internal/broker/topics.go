package broker

import (
	"errors"
	"fmt"
	"sort"

	"github.com/outboxrelay/relay/internal/topicname"
)

// ValidateTopicName applies Kafka's topic naming rules.
func ValidateTopicName(name string) error {
	if err := topicname.Check(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidTopic, err)
	}
	return nil
}

// CreateTopic creates a topic; unset config fields take the broker's
// defaults. It fails with ErrTopicExists if the topic exists.
func (b *Broker) CreateTopic(name string, cfg TopicConfig) (TopicInfo, error) {
	if err := ValidateTopicName(name); err != nil {
		return TopicInfo{}, err
	}
	cfg = b.fillTopicConfig(cfg)
	if err := cfg.validate(); err != nil {
		return TopicInfo{}, err
	}
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	b.mu.RLock()
	_, exists := b.topics[name]
	closed := b.closed
	h := b.health.Load()
	b.mu.RUnlock()
	if closed {
		return TopicInfo{}, ErrClosed
	}
	if err := h.check(); err != nil {
		return TopicInfo{}, err
	}
	if exists {
		return TopicInfo{}, fmt.Errorf("%w: %s", ErrTopicExists, name)
	}
	b.mu.RLock()
	deleted := b.deleted[name]
	b.mu.RUnlock()
	if deleted {
		return TopicInfo{}, fmt.Errorf("%w: %s was deleted since the broker opened and may still be in its journal; it can be created again once the broker reopened (a restart)", ErrRecentlyDeleted, name)
	}
	// A directory no topic names is what a crash in DeleteTopic left.
	if err := b.trashTopicDir(name); err != nil {
		return TopicInfo{}, err
	}
	t, err := b.openTopic(name, cfg, h, false, nil)
	if err != nil {
		return TopicInfo{}, err
	}
	if err := b.syncTopicsDir(h); err != nil {
		t.closeParts()
		return TopicInfo{}, err
	}
	m := b.copyMeta()
	m.Topics[name] = cfg
	if err := b.saveMetaLocked(m); err != nil {
		for _, p := range t.parts {
			_ = p.close()
		}
		return TopicInfo{}, err
	}
	b.mu.Lock()
	b.meta = m
	b.topics[name] = t
	b.mu.Unlock()
	b.configVersion.Add(1)
	return t.info(), nil
}

// AlterTopicConfig replaces a topic's configuration with cfg, whose zero
// fields take the broker's defaults as in CreateTopic, except the
// partition count: zero keeps it, and any other count than the current
// one fails with ErrInvalidConfig (adding partitions moves keys; it is not
// a configuration change: see AddPartitions). The new configuration is durable in meta.json
// before any reader sees it; appends, segment rolls, retention and
// compaction use it from their next step on, and the janitor runs a pass
// at once, so a shorter retention deletes what it no longer keeps. As in Kafka, records without a key
// do not survive compaction when a topic turns compact.
func (b *Broker) AlterTopicConfig(name string, cfg TopicConfig) (TopicInfo, error) {
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	t, err := b.changingTopic(name)
	if err != nil {
		return TopicInfo{}, err
	}
	current := t.set.config()
	if cfg.Partitions == 0 {
		cfg.Partitions = current.Partitions
	}
	if cfg.Partitions != current.Partitions {
		return TopicInfo{}, fmt.Errorf("%w: %s has %d partitions; changing the count to %d is not a configuration change",
			ErrInvalidConfig, name, current.Partitions, cfg.Partitions)
	}
	cfg = b.fillTopicConfig(cfg)
	if err := cfg.validate(); err != nil {
		return TopicInfo{}, err
	}
	m := b.copyMeta()
	m.Topics[name] = cfg
	if err := b.saveMetaLocked(m); err != nil {
		return TopicInfo{}, err
	}
	b.mu.Lock()
	b.meta = m
	b.mu.Unlock()
	t.set.cfg.Store(&cfg)
	b.configVersion.Add(1)
	b.kickJanitor()
	return t.info(), nil
}

func (b *Broker) copyMeta() metadata {
	b.mu.RLock()
	defer b.mu.RUnlock()
	m := b.meta
	m.Producers = make(map[string]stableProducer, len(b.meta.Producers))
	for k, v := range b.meta.Producers {
		m.Producers[k] = v
	}
	m.Topics = make(map[string]TopicConfig, len(b.meta.Topics))
	for k, v := range b.meta.Topics {
		m.Topics[k] = v
	}
	return m
}

// EnsureTopic returns the topic, creating it with the defaults if missing.
func (b *Broker) EnsureTopic(name string) (TopicInfo, error) {
	if info, err := b.Topic(name); err == nil {
		return info, nil
	}
	info, err := b.CreateTopic(name, TopicConfig{})
	if errors.Is(err, ErrTopicExists) {
		return b.Topic(name)
	}
	return info, err
}

// EnsureTopics makes sure every named topic exists, creating the missing
// ones with the broker's default configuration all together: their
// partitions are created in parallel, DIR/topics is fsynced once and
// meta.json written once for all of them, so a thousand new topics cost
// a few rounds of fsyncs rather than a few per topic. Each topic is
// durable (its directories fsynced, meta.json naming it) before
// EnsureTopics returns, as with CreateTopic. A name that is invalid or
// was deleted since the broker opened is not created; the error names
// each such one, and the others are created all the same.
func (b *Broker) EnsureTopics(names []string) error {
	cfg := b.fillTopicConfig(TopicConfig{})
	if err := cfg.validate(); err != nil {
		return err
	}
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	var errs []error
	var todo []string
	seen := map[string]bool{}
	b.mu.RLock()
	closed, h := b.closed, b.health.Load()
	for _, name := range names {
		if seen[name] {
			continue
		}
		seen[name] = true
		if _, ok := b.topics[name]; ok {
			continue
		}
		if err := ValidateTopicName(name); err != nil {
			errs = append(errs, err)
			continue
		}
		if b.deleted[name] {
			errs = append(errs, fmt.Errorf("%w: %s was deleted since the broker opened and may still be in its journal; it can be created again once the broker reopened (a restart)", ErrRecentlyDeleted, name))
			continue
		}
		todo = append(todo, name)
	}
	b.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	if err := h.check(); err != nil {
		return err
	}
	if len(todo) == 0 {
		return errors.Join(errs...)
	}
	for _, name := range todo {
		if err := b.trashTopicDir(name); err != nil {
			return err
		}
	}
	created := make([]*topic, len(todo))
	openErrs := parallel(len(todo), openParallelism, func(i int) error {
		var err error
		created[i], err = b.openTopic(todo[i], cfg, h, false, nil)
		return err
	})
	closeAll := func() {
		for _, t := range created {
			if t != nil {
				t.closeParts()
			}
		}
	}
	for i, err := range openErrs {
		if err != nil {
			closeAll()
			return fmt.Errorf("create topic %s: %w", todo[i], err)
		}
	}
	if err := b.syncTopicsDir(h); err != nil {
		closeAll()
		return err
	}
	m := b.copyMeta()
	for _, name := range todo {
		m.Topics[name] = cfg
	}
	if err := b.saveMetaLocked(m); err != nil {
		closeAll()
		return err
	}
	b.mu.Lock()
	b.meta = m
	for _, t := range created {
		b.topics[t.name] = t
	}
	b.mu.Unlock()
	b.configVersion.Add(1)
	return errors.Join(errs...)
}

// TopicInfo describes a topic and its partitions.
type TopicInfo struct {
	Name       string
	Config     TopicConfig
	Partitions []PartitionInfo
}

func (t *topic) info() TopicInfo {
	ti := TopicInfo{Name: t.name, Config: t.set.config()}
	for _, p := range t.parts {
		ti.Partitions = append(ti.Partitions, p.info())
	}
	return ti
}

// Topic describes one topic.
func (b *Broker) Topic(name string) (TopicInfo, error) {
	t, err := b.topicNamed(name)
	if err != nil {
		return TopicInfo{}, err
	}
	return t.info(), nil
}

// TopicConfig returns one topic's configuration: Topic(name).Config,
// without describing every partition.
func (b *Broker) TopicConfig(name string) (TopicConfig, error) {
	t, err := b.topicNamed(name)
	if err != nil {
		return TopicConfig{}, err
	}
	return t.set.config(), nil
}

func (b *Broker) topicNamed(name string) (*topic, error) {
	b.mu.RLock()
	t := b.topics[name]
	b.mu.RUnlock()
	if t == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownTopicOrPartition, name)
	}
	return t, nil
}

// Topics lists all topics sorted by name.
func (b *Broker) Topics() []TopicInfo {
	ts := b.topicList()
	sort.Slice(ts, func(i, j int) bool { return ts[i].name < ts[j].name })
	out := make([]TopicInfo, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.info())
	}
	return out
}

func (b *Broker) lookup(name string, part int32, create bool) (*topic, *partition, error) {
	b.mu.RLock()
	t, closed := b.topics[name], b.closed
	b.mu.RUnlock()
	if closed {
		return nil, nil, ErrClosed
	}
	if t == nil && create && b.opts.AutoCreateTopics {
		if _, err := b.EnsureTopic(name); err != nil {
			return nil, nil, err
		}
		b.mu.RLock()
		t = b.topics[name]
		b.mu.RUnlock()
	}
	if t == nil {
		if err := ValidateTopicName(name); err != nil {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("%w: topic %s", ErrUnknownTopicOrPartition, name)
	}
	if part < 0 || int(part) >= len(t.parts) {
		return nil, nil, fmt.Errorf("%w: %s/%d", ErrUnknownTopicOrPartition, name, part)
	}
	return t, t.parts[part], nil
}

// partitionFor returns an open partition, nil when there is none.
func (b *Broker) partitionFor(topicName string, part int32) *partition {
	b.mu.RLock()
	defer b.mu.RUnlock()
	t := b.topics[topicName]
	if t == nil || part < 0 || int(part) >= len(t.parts) {
		return nil
	}
	return t.parts[part]
}

func (t *topic) closeParts() {
	for _, q := range t.parts {
		_ = q.close()
	}
}
