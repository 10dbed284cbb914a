package broker

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"time"
)

// Dir is the broker's data directory.
func (b *Broker) Dir() string { return b.opts.Dir }

// ConfigVersion changes whenever a topic is created, altered, given more
// partitions or deleted: a writer that caches topic configurations (the
// relay's sink) drops its cache when it moved.
func (b *Broker) ConfigVersion() int64 { return b.configVersion.Load() }

// SetDefaultTopicConfig replaces Options.DefaultTopicConfig for topics
// created from now on (existing topics keep their configuration). Its
// partition count, when zero, stays Options.DefaultPartitions.
func (b *Broker) SetDefaultTopicConfig(cfg TopicConfig) error {
	if err := cfg.withDefaults(b.opts.DefaultPartitions).validate(); err != nil {
		return err
	}
	b.defaults.Store(&cfg)
	return nil
}

// KeyMovement is what raising a topic's partition count would do to the
// keys its log holds: Keys distinct keys were seen (keyless records are
// counted apart, they have no order to keep), and Moving of them land on
// another partition under the new count (murmur2, PartitionForKey) than
// under the current one, so their records after the change are no longer
// ordered after their earlier ones.
type KeyMovement struct {
	Topic          string
	From, To       int32
	Keys, Moving   int64
	KeylessRecords int64
}

func (m KeyMovement) String() string {
	pct := 0.0
	if m.Keys > 0 {
		pct = 100 * float64(m.Moving) / float64(m.Keys)
	}
	return fmt.Sprintf("raising %s from %d to %d partitions moves %d of the %d keys in its log (%.1f%%) to another partition; %d keyless records are unaffected",
		m.Topic, m.From, m.To, m.Moving, m.Keys, pct, m.KeylessRecords)
}

// KeyMovement reads every record of the topic (from each log start to its
// high watermark) and counts the keys that a partition count of to would
// move. It fails with ErrInvalidPartitions when to is not above the
// current count.
func (b *Broker) KeyMovement(ctx context.Context, name string, to int32) (KeyMovement, error) {
	m, _, err := b.keyMovement(ctx, name, to)
	return m, err
}

// keyMovement is KeyMovement, also returning the keys it saw and where
// each partition's reading ended, for a later reading of what came since.
func (b *Broker) keyMovement(ctx context.Context, name string, to int32) (KeyMovement, *keyScan, error) {
	ti, err := b.Topic(name)
	if err != nil {
		return KeyMovement{}, nil, err
	}
	from := int32(len(ti.Partitions))
	m := KeyMovement{Topic: name, From: from, To: to}
	if err := checkIncrease(name, from, to); err != nil {
		return m, nil, err
	}
	ks := &keyScan{seen: map[keyHash]struct{}{}, next: make([]int64, from)}
	for part := range from {
		ks.next[part] = ti.Partitions[part].LogStartOffset
	}
	err = b.scanKeys(ctx, &m, ks)
	return m, ks, err
}

// keyScan is a reading of a topic's keys under way: the keys seen, and
// the next offset to read of each partition.
type keyScan struct {
	seen map[keyHash]struct{}
	next []int64
	buf  []byte
}

// scanKeys reads each partition from ks.next to its high watermark, adding
// the keys not seen yet to m.
func (b *Broker) scanKeys(ctx context.Context, m *KeyMovement, ks *keyScan) error {
	name, from, to := m.Topic, m.From, m.To
	for part := range from {
		offset := ks.next[part]
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			res, err := b.FetchInto(ctx, name, part, offset, 1<<20, ks.buf[:0])
			if err != nil {
				return err
			}
			ks.buf = res.Batches
			if len(res.Batches) == 0 || offset >= res.HighWatermark {
				break
			}
			for rest := res.Batches; len(rest) >= BatchHeaderSize; {
				h, err := ParseBatchHeader(rest)
				if err != nil || h.Size() > len(rest) {
					return fmt.Errorf("%s/%d at offset %d: %w", name, part, offset, ErrCorruptBatch)
				}
				if !h.Control() {
					_, recs, err := DecodeBatch(rest[:h.Size()])
					if err != nil {
						return fmt.Errorf("%s/%d at offset %d: %w", name, part, h.BaseOffset, err)
					}
					for _, r := range recs {
						if r.Key == nil {
							m.KeylessRecords++
							continue
						}
						k := hashKey(r.Key)
						if _, ok := ks.seen[k]; ok {
							continue
						}
						ks.seen[k] = struct{}{}
						m.Keys++
						if PartitionForKey(r.Key, from) != PartitionForKey(r.Key, to) {
							m.Moving++
						}
					}
				}
				offset = h.LastOffset() + 1
				rest = rest[h.Size():]
			}
		}
		ks.next[part] = offset
	}
	return nil
}

// ErrKeysWouldMove means a partition increase asked to move no key would
// move some: it is a migration, to be confirmed (AddPartitions).
var ErrKeysWouldMove = errors.New("broker: the partition increase would move keys")

// AddPartitionsMovingNoKey raises a topic's partition count to count if
// that moves none of the keys in its log (an empty topic, only keyless
// records, or keys that all stay where they are): then no key's order is
// at stake, and the increase needs no confirmation. Otherwise it changes
// nothing and fails with ErrKeysWouldMove, with the report.
//
// Fault model: the log is read once in full, then, with the topic's
// metadata locked against other changes, again from where that reading
// ended, just before the new count is written to meta.json; a keyed record
// that would move, appended by then, refuses the increase. What it does
// not cover: a keyed record appended during the meta.json write itself
// (milliseconds), and producers that keep routing by a count they cached
// before the change; Kafka has both windows for every increase.
// TestAddPartitionsMovingNoKey shows an empty topic, a keyless one and one
// whose keys all stay raised, and one whose keys would move refused and
// unchanged.
func (b *Broker) AddPartitionsMovingNoKey(ctx context.Context, name string, count int32) (KeyMovement, error) {
	m, ks, err := b.keyMovement(ctx, name, count)
	if err != nil {
		return m, err
	}
	if m.Moving > 0 {
		return m, fmt.Errorf("%w: %s", ErrKeysWouldMove, m)
	}
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	if t, err := b.changingTopic(name); err != nil {
		return m, err
	} else if int32(len(t.parts)) != m.From {
		return m, fmt.Errorf("%w: %s changed from %d to %d partitions meanwhile", ErrInvalidPartitions, name, m.From, len(t.parts))
	}
	if err := b.scanKeys(ctx, &m, ks); err != nil {
		return m, err
	}
	if m.Moving > 0 {
		return m, fmt.Errorf("%w: %s (appended while it was read)", ErrKeysWouldMove, m)
	}
	_, err = b.addPartitionsLocked(name, count)
	return m, err
}

func checkIncrease(name string, from, to int32) error {
	switch {
	case to < from:
		return fmt.Errorf("%w: %s has %d partitions; a partition count is never lowered (records would be lost and every key moved)", ErrInvalidPartitions, name, from)
	case to == from:
		return fmt.Errorf("%w: %s already has %d partitions", ErrInvalidPartitions, name, from)
	case to > 100000:
		return fmt.Errorf("%w: %d partitions", ErrInvalidPartitions, to)
	}
	return nil
}

// AddPartitions raises a topic's partition count to count. It is a
// migration, not a configuration change: keys move (see KeyMovement), so
// callers confirm it before calling. Fewer partitions are refused with
// ErrInvalidPartitions. The new partitions' directories are durable before
// meta.json lists the count, as for a new topic.
func (b *Broker) AddPartitions(name string, count int32) (TopicInfo, error) {
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	return b.addPartitionsLocked(name, count)
}

// addPartitionsLocked is AddPartitions with b.metaMu held.
func (b *Broker) addPartitionsLocked(name string, count int32) (TopicInfo, error) {
	t, err := b.changingTopic(name)
	if err != nil {
		return TopicInfo{}, err
	}
	from := int32(len(t.parts))
	if err := checkIncrease(name, from, count); err != nil {
		return TopicInfo{}, err
	}
	var added []*partition
	closeAdded := func() {
		for _, p := range added {
			_ = p.close()
		}
	}
	for i := from; i < count; i++ {
		p, err := openPartition(t.set, partitionDir(b.opts.Dir, name, i), name, i, false, nil)
		if err != nil {
			closeAdded()
			return TopicInfo{}, fmt.Errorf("open %s/%d: %w", name, i, err)
		}
		added = append(added, p)
	}
	if err := b.health.Load().syncDir(b.opts.FS, filepath.Dir(partitionDir(b.opts.Dir, name, 0)), "fsync topic dir"); err != nil {
		closeAdded()
		return TopicInfo{}, err
	}
	cfg := t.set.config()
	cfg.Partitions = count
	m := b.copyMeta()
	m.Topics[name] = cfg
	if err := b.saveMetaLocked(m); err != nil {
		closeAdded()
		return TopicInfo{}, err
	}
	nt := &topic{name: name, set: t.set, parts: append(append([]*partition(nil), t.parts...), added...)}
	t.set.cfg.Store(&cfg)
	b.mu.Lock()
	b.meta = m
	b.topics[name] = nt
	b.mu.Unlock()
	b.configVersion.Add(1)
	b.opts.Logger.Info("added partitions", "topic", name, "from", from, "to", count)
	return nt.info(), nil
}

// DeleteTopic removes a topic and its records. It is gone from meta.json
// before its files go (a crash in between leaves a directory no topic
// names, which is moved aside if the name is created again). Until the
// broker is reopened, the name cannot be created again
// (ErrRecentlyDeleted): the write-ahead journal may still hold the
// deleted topic's batches, and replaying them into a new topic of the
// same name would bring them back.
func (b *Broker) DeleteTopic(name string) error {
	b.metaMu.Lock()
	defer b.metaMu.Unlock()
	t, err := b.changingTopic(name)
	if err != nil {
		return err
	}
	m := b.copyMeta()
	delete(m.Topics, name)
	if err := b.saveMetaLocked(m); err != nil {
		return err
	}
	b.mu.Lock()
	b.meta = m
	delete(b.topics, name)
	if b.deleted == nil {
		b.deleted = map[string]bool{}
	}
	b.deleted[name] = true
	b.mu.Unlock()
	b.configVersion.Add(1)
	for _, p := range t.parts {
		// Closed without the fsync and snapshot of a clean close: the
		// files go. Waiting appenders and fetchers get ErrClosed.
		_ = p.whileOpen(func() error {
			p.closed = true
			p.closeAll()
			p.notifyLocked()
			return nil
		})
	}
	b.opts.Logger.Info("deleted topic", "topic", name, "partitions", len(t.parts))
	return b.trashTopicDir(name)
}

// trashTopicDir moves a topic's directory out of topics/ (into deleted/)
// and removes it.
func (b *Broker) trashTopicDir(name string) error {
	dir := filepath.Join(b.opts.Dir, "topics", name)
	if _, err := b.opts.FS.ReadDir(dir); err != nil {
		return nil
	}
	trash := filepath.Join(b.opts.Dir, "deleted")
	if err := b.opts.FS.MkdirAll(trash, 0o755); err != nil {
		return storageErr("create deleted dir", err)
	}
	to := filepath.Join(trash, name+"-"+strconv.FormatInt(time.Now().UnixNano(), 10))
	if err := b.opts.FS.Rename(dir, to); err != nil {
		return storageErr("move deleted topic aside", err)
	}
	if err := b.opts.FS.SyncDir(filepath.Join(b.opts.Dir, "topics")); err != nil {
		return storageErr("fsync topics dir", err)
	}
	return storageErr("remove deleted topic", removeAll(b.opts.FS, to))
}

// removeAll removes dir and everything below it through fsys.
func removeAll(fsys FS, dir string) error {
	entries, err := fsys.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.IsDir() {
			if err := removeAll(fsys, p); err != nil {
				return err
			}
			continue
		}
		if err := fsys.Remove(p); err != nil {
			return err
		}
	}
	return fsys.Remove(dir)
}

// changingTopic returns the topic a configuration or partition change is
// about (the caller holds metaMu): ErrClosed on a closed broker, then
// ErrUnknownTopicOrPartition, then the storage's failure, in that order.
func (b *Broker) changingTopic(name string) (*topic, error) {
	b.mu.RLock()
	t := b.topics[name]
	closed := b.closed
	h := b.health.Load()
	b.mu.RUnlock()
	if closed {
		return nil, ErrClosed
	}
	if t == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnknownTopicOrPartition, name)
	}
	if err := h.check(); err != nil {
		return nil, err
	}
	return t, nil
}
