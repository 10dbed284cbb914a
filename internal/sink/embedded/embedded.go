// Package embedded is the relay's sink into the embedded broker: it
// publishes outbox events as an idempotent producer with a stable identity,
// so that each event lands in the log exactly once, across crashes.
//
// # Exactly once, step by step
//
//  1. Identity. On its first start against a data directory the sink asks
//     the broker for a producer id and records it in the directory
//     (relay-producer.json, replaced atomically). Every later start reuses
//     that id and epoch: the leader lock and the directory's flock make sure
//     only one relay produces with it.
//  2. Sequences. Each (topic, partition) has a counter. A batch for a
//     partition carries base sequence = the counter; the counter advances by
//     the batch's record count. Counters are unbounded int64 here and wrap
//     to Kafka's int32 sequence space on the wire.
//  3. Checkpoint. After every Publish the sink hands the core its state (id,
//     epoch, counters), which the core saves in Postgres in the same
//     transaction that deletes the published rows. So the saved counters
//     always describe exactly the rows that are gone.
//  4. Crash. Rows still in the outbox are the events not acknowledged.
//     Some of them may already be in the log (published, then the relay
//     died before the acknowledgement committed).
//  5. Restart. The source re-delivers those rows in the same order, and the
//     core routes them to the same partitions, so the sink, starting from the
//     saved counters, gives each the same sequence number it had before. The
//     broker's producer state for each partition says the last sequence it
//     made durable; a message whose sequence is at or below it is already
//     in the log, and is skipped. The rest are appended. Were a retried
//     batch sent anyway, the broker would answer it as a duplicate (it keeps
//     the last five batches) or refuse it as out of order, never append it
//     twice.
//
// The broker is opened in Start, that is only once this relay leads, and
// closed in Close. Start waits while another process holds the directory.
package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/relay"
)

// Config configures the sink.
type Config struct {
	// Broker are the options the broker is opened with; Dir is required.
	Broker broker.Options
	// OnOpen, when set, runs after the broker opens, and its returned
	// function before it closes: the Kafka listener attaches here.
	OnOpen func(*broker.Broker) (stop func())
	Logger *slog.Logger
}

// Sink publishes into the embedded broker.
type Sink struct {
	cfg Config

	mu     sync.Mutex
	b      *broker.Broker
	stopFn func()
	st     state
	// durable is, per partition, the last sequence the broker had made
	// durable for this producer when the sink started; messages at or below
	// it are already in the log.
	durable map[tp]int32
	// checked marks partitions whose producer state was read this session.
	checked map[tp]bool
	// topics caches topic settings; a topic's partition count never
	// changes.
	topics map[string]broker.TopicConfig
	// failure is the last Publish error, until a Publish succeeds; it
	// survives restarts of the sink.
	failure error
	// enc is the encoding buffer, reused from batch to batch.
	enc []byte
}

// maxEncodeBuffer is the largest encoding buffer kept for reuse.
const maxEncodeBuffer = 8 << 20

var _ relay.PipelinedSink = (*Sink)(nil)

type tp struct {
	topic     string
	partition int32
}

// state is what the core saves with each acknowledgement.
type state struct {
	ProducerID int64                      `json:"producer_id"`
	Epoch      int16                      `json:"epoch"`
	Next       map[string]map[int32]int64 `json:"next"`
}

func (s *state) next(k tp) int64 { return s.Next[k.topic][k.partition] }

func (s *state) advance(k tp, n int) {
	if s.Next[k.topic] == nil {
		s.Next[k.topic] = map[int32]int64{}
	}
	s.Next[k.topic][k.partition] += int64(n)
}

func (s *state) clone() state {
	c := state{ProducerID: s.ProducerID, Epoch: s.Epoch, Next: make(map[string]map[int32]int64, len(s.Next))}
	for t, parts := range s.Next {
		c.Next[t] = make(map[int32]int64, len(parts))
		for p, n := range parts {
			c.Next[t][p] = n
		}
	}
	return c
}

// New returns a sink; Start opens the broker.
func New(cfg Config) (*Sink, error) {
	if cfg.Broker.Dir == "" {
		return nil, errors.New("embedded sink: a data directory is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Sink{cfg: cfg}, nil
}

// Broker returns the open broker, or nil outside Start..Close.
func (s *Sink) Broker() *broker.Broker {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b
}

const identityFile = "relay-producer.json"

// Start opens the broker (waiting while another process holds the
// directory) and resumes from the saved state.
func (s *Sink) Start(ctx context.Context, saved []byte) error {
	s.Close(ctx)
	if err := os.MkdirAll(s.cfg.Broker.Dir, 0o755); err != nil {
		return fmt.Errorf("embedded sink: %w", err)
	}
	var b *broker.Broker
	for waited := false; ; waited = true {
		var err error
		b, err = broker.Open(ctx, s.cfg.Broker)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("embedded sink: opening the broker: %w", err)
		}
		if !waited {
			s.cfg.Logger.Info("waiting for another process to release the data directory", "dir", s.cfg.Broker.Dir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	id, err := s.identity(ctx, b)
	if err != nil {
		b.Close()
		return err
	}
	st := state{Next: map[string]map[int32]int64{}}
	if saved != nil {
		if err := json.Unmarshal(saved, &st); err != nil {
			b.Close()
			return fmt.Errorf("embedded sink: reading the saved state: %w", err)
		}
	}
	if st.ProducerID != id.ID || st.Epoch != id.Epoch {
		// A new data directory (or the first start): nothing published
		// before is in this log, so numbering starts afresh.
		st = state{ProducerID: id.ID, Epoch: id.Epoch, Next: map[string]map[int32]int64{}}
	}
	var stop func()
	if s.cfg.OnOpen != nil {
		stop = s.cfg.OnOpen(b)
	}
	s.mu.Lock()
	s.b, s.st, s.stopFn = b, st, stop
	s.durable, s.checked, s.topics = map[tp]int32{}, map[tp]bool{}, map[string]broker.TopicConfig{}
	s.mu.Unlock()
	return nil
}

// identity reads the producer id recorded in the data directory, or
// allocates and records one.
func (s *Sink) identity(ctx context.Context, b *broker.Broker) (broker.ProducerID, error) {
	path := filepath.Join(s.cfg.Broker.Dir, identityFile)
	var id broker.ProducerID
	data, err := os.ReadFile(path)
	if err == nil {
		if err := json.Unmarshal(data, &id); err != nil {
			return id, fmt.Errorf("embedded sink: %s is damaged: %w", path, err)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return id, fmt.Errorf("embedded sink: %w", err)
	}
	id, err = b.InitProducerID(ctx, "")
	if err != nil {
		return id, fmt.Errorf("embedded sink: allocating a producer id: %w", err)
	}
	data, _ = json.Marshal(id)
	if err := writeFileAtomic(path, data); err != nil {
		return id, fmt.Errorf("embedded sink: recording the producer id: %w", err)
	}
	return id, nil
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

// group is the messages of one partition within a Publish, in order.
type group struct {
	key     tp
	indexes []int
	// firstSeq is the sequence of the group's first message.
	firstSeq int64
}

// Publish appends msgs, one batch (or more, when large) per partition, and
// returns when all are fsynced.
func (s *Sink) Publish(ctx context.Context, msgs []relay.Message) (relay.PublishResult, error) {
	wait, err := s.PublishAsync(ctx, msgs)
	if err != nil {
		return relay.PublishResult{}, err
	}
	return wait()
}

// PublishAsync writes msgs to the log, one batch (or more, when large) per
// partition, behind everything written before, and returns without waiting
// for the fsync; wait waits for it. So the core can encode and write the
// next batch while this one's fsync runs, and one fsync covers several
// batches. The sequence counters advance at once: a later error fails the
// pipeline, and the restart (Start with the acknowledged state) rewinds
// them.
func (s *Sink) PublishAsync(ctx context.Context, msgs []relay.Message) (wait func() (relay.PublishResult, error), err error) {
	s.mu.Lock()
	b := s.b
	s.mu.Unlock()
	if b == nil {
		return nil, errors.New("embedded sink: Publish before Start")
	}
	res := relay.PublishResult{Failed: map[int]error{}}
	groups := map[tp]*group{}
	var order []*group
	for i, m := range msgs {
		cfg, err := s.topicConfig(b, m.Topic)
		if err != nil {
			if errors.Is(err, broker.ErrInvalidTopic) {
				res.Failed[i] = err
				continue
			}
			return nil, fmt.Errorf("embedded sink: topic %s: %w", m.Topic, err)
		}
		// Refusals are decided here, before sequence numbers are given
		// out, so a refused message never leaves a gap in the sequence.
		if err := admissible(m, cfg); err != nil {
			res.Failed[i] = err
			continue
		}
		// Keyless events have no order to keep: they are spread by event
		// id, which puts a re-delivered event on the same partition again.
		p := broker.PartitionForKey(partitionKey(m), cfg.Partitions)
		k := tp{m.Topic, p}
		g := groups[k]
		if g == nil {
			g = &group{key: k}
			groups[k] = g
			order = append(order, g)
		}
		g.indexes = append(g.indexes, i)
	}
	next := s.st.clone()
	for _, g := range order {
		if err := s.learn(b, g.key, &next); err != nil {
			return nil, err
		}
		g.firstSeq = next.next(g.key)
		next.advance(g.key, len(g.indexes))
	}
	var waits []func() error
	for _, g := range order {
		if err := s.appendGroup(ctx, b, g, msgs, next, &waits); err != nil {
			s.setFailure(err)
			return nil, err
		}
	}
	s.st = next
	return func() (relay.PublishResult, error) {
		var errs []error
		for _, w := range waits {
			if err := w(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			err = fmt.Errorf("embedded sink: making a batch durable: %w", err)
			s.setFailure(err)
			return relay.PublishResult{}, err
		}
		s.setFailure(nil)
		state, err := json.Marshal(next)
		if err != nil {
			return relay.PublishResult{}, err
		}
		res.State = state
		return res, nil
	}, nil
}

// appendGroup writes one partition's messages, skipping those the broker
// already holds, splitting batches that exceed the topic's size limit, and
// adds what waits for their fsync to waits.
func (s *Sink) appendGroup(ctx context.Context, b *broker.Broker, g *group, msgs []relay.Message, st state, waits *[]func() error) error {
	seq := g.firstSeq
	indexes := g.indexes
	if last, ok := s.durable[g.key]; ok {
		for len(indexes) > 0 && seqAtOrBefore(seq, last) {
			indexes, seq = indexes[1:], seq+1
		}
		if skipped := len(g.indexes) - len(indexes); skipped > 0 {
			s.cfg.Logger.Info("skipped re-delivered events the log already holds",
				"topic", g.key.topic, "partition", g.key.partition, "events", skipped)
		}
	}
	var appendRange func(idx []int, seq int64) error
	appendRange = func(idx []int, seq int64) error {
		if len(idx) == 0 {
			return nil
		}
		records := make([]broker.Record, len(idx))
		var nh int
		for _, i := range idx {
			nh += len(msgs[i].Headers)
		}
		headers := make([]broker.Header, 0, nh)
		for j, i := range idx {
			records[j], headers = appendRecord(msgs[i], headers)
		}
		batch, err := broker.AppendBatch(s.enc[:0], broker.BatchOptions{ProducerID: st.ProducerID, ProducerEpoch: st.Epoch, BaseSequence: wireSeq(seq)}, records)
		if err != nil {
			return fmt.Errorf("embedded sink: encoding a batch: %w", err)
		}
		// The broker has written (and the journal copied) the batch when
		// AppendAsync returns, so the buffer serves the next one.
		if cap(batch) <= maxEncodeBuffer {
			s.enc = batch
		}
		_, wait, err := b.AppendAsync(ctx, g.key.topic, g.key.partition, batch)
		switch {
		case err == nil:
			*waits = append(*waits, wait)
			return nil
		case errors.Is(err, broker.ErrMessageTooLarge) && len(idx) > 1:
			half := len(idx) / 2
			if err := appendRange(idx[:half], seq); err != nil {
				return err
			}
			return appendRange(idx[half:], seq+int64(half))
		default:
			return fmt.Errorf("embedded sink: appending to %s/%d: %w", g.key.topic, g.key.partition, err)
		}
	}
	return appendRange(indexes, seq)
}

// learn reads, once per session and partition, the last sequence the broker
// made durable for this producer. When the log holds less than the saved
// counter says (it lost acknowledged data: only possible under an unsafe
// sync policy), numbering continues where the log is, with a warning, so
// that appends are not refused as out of order forever.
func (s *Sink) learn(b *broker.Broker, k tp, st *state) error {
	if s.checked[k] {
		return nil
	}
	ps, ok, err := b.ProducerState(k.topic, k.partition, st.ProducerID)
	if err != nil {
		return fmt.Errorf("embedded sink: reading producer state of %s/%d: %w", k.topic, k.partition, err)
	}
	s.checked[k] = true
	if !ok || ps.Epoch != st.Epoch {
		return nil
	}
	last := ps.LastSequence()
	s.durable[k] = last
	first := st.next(k)
	gap := (int64(wireSeq(first)) - (int64(last) + 1) + 2<<31) % (1 << 31)
	if gap > 0 && gap < 1<<30 {
		s.cfg.Logger.Warn("the log is missing acknowledged records; continuing after its last sequence",
			"topic", k.topic, "partition", k.partition, "missing", gap)
		st.advance(k, -int(gap))
	}
	return nil
}

// partitionKey is what the partitioner hashes: the key, or for a keyless
// message its event id.
func partitionKey(m relay.Message) []byte {
	if m.Key != nil {
		return m.Key
	}
	return m.EventID()
}

// topicConfig returns a topic's settings, creating the topic on first use.
func (s *Sink) topicConfig(b *broker.Broker, topic string) (broker.TopicConfig, error) {
	if cfg, ok := s.topics[topic]; ok {
		return cfg, nil
	}
	info, err := b.EnsureTopic(topic)
	if err != nil {
		return broker.TopicConfig{}, err
	}
	s.topics[topic] = info.Config
	return info.Config, nil
}

// admissible checks what the broker would refuse for this message alone: a
// keyless record on a compacted topic, or a record whose batch is over the
// topic's size limit.
func admissible(m relay.Message, cfg broker.TopicConfig) error {
	if m.Key == nil && cfg.CleanupPolicy == broker.CleanupCompact {
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

func toRecord(m relay.Message) broker.Record {
	r, _ := appendRecord(m, nil)
	return r
}

// appendRecord converts m, its headers appended to (and aliasing) hs, so a
// batch's headers take one allocation.
func appendRecord(m relay.Message, hs []broker.Header) (broker.Record, []broker.Header) {
	start := len(hs)
	for _, mh := range m.Headers {
		hs = append(hs, broker.Header{Key: mh.Key, Value: mh.Value})
	}
	return broker.Record{Timestamp: m.Timestamp, Key: m.Key, Value: m.Value, Headers: hs[start:len(hs):len(hs)]}, hs
}

// wireSeq maps an unbounded sequence counter onto Kafka's int32 sequence,
// which wraps from MaxInt32 to 0.
func wireSeq(seq int64) int32 { return int32(seq % (1 << 31)) }

// seqAtOrBefore reports whether counter seq is at or before the broker's
// wrapped last sequence, assuming the two are within 2^30 of each other.
func seqAtOrBefore(seq int64, last int32) bool {
	d := (int64(last) - int64(wireSeq(seq)) + 1<<31) % (1 << 31)
	return d < 1<<30
}

func (s *Sink) setFailure(err error) {
	s.mu.Lock()
	s.failure = err
	s.mu.Unlock()
}

// Ready reports whether the broker is open and the last Publish, if it
// failed (a full disk, say), has since succeeded.
func (s *Sink) Ready(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.b == nil {
		return errors.New("embedded broker is not open")
	}
	if s.failure != nil {
		return fmt.Errorf("the last publish failed: %w", s.failure)
	}
	return nil
}

// Close stops the listener hook and closes the broker.
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	b, stop := s.b, s.stopFn
	s.b, s.stopFn = nil, nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	if b == nil {
		return nil
	}
	return b.Close()
}
