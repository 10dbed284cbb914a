package embedded

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/relay"
)

// group is the messages of one partition within a Publish, in order.
type group struct {
	key     tp
	indexes []int
	// seq is the partition's next sequence: taken from Sink.seq before
	// the appends, moved by them, and put back after.
	seq int32
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

// appended is one batch written to the log and not yet known durable.
type appended struct {
	key  tp
	wait func() error
	// end is the offset after the batch.
	end int64
}

// PublishAsync writes msgs to the log, one batch (or more, when large) per
// partition, behind everything written before, and returns without waiting
// for the fsync; wait waits for it. So the core can encode and write the
// next batch while this one's fsync runs, and one fsync covers several
// batches. Messages the log already holds (step 4 of the package doc) are
// reported published without being appended.
func (s *Sink) PublishAsync(ctx context.Context, msgs []relay.Message) (wait func() (relay.PublishResult, error), err error) {
	s.mu.Lock()
	b, fence, in, placements := s.b, s.fence, s.inSession, s.placements
	s.mu.Unlock()
	if b == nil || !in {
		return nil, errors.New("embedded sink: Publish outside a session")
	}
	res := relay.PublishResult{Failed: map[int]error{}}
	if s.groupOf == nil {
		s.groupOf = map[tp]int{}
	}
	clear(s.groupOf)
	ngroups := 0
	var skipped []string
	// waits are the topics the broker does not have (WaitForTopics):
	// nothing of the batch is appended, and it is offered again.
	var waits []error
	waiting := map[string]bool{}
	if !s.cfg.WaitForTopics {
		s.createTopics(b, msgs)
	}
	for i, m := range msgs {
		if len(s.seen) > 0 {
			if id := m.Identity(); id != "" {
				if _, ok := s.seen[id]; ok {
					delete(s.seen, id)
					skipped = append(skipped, id)
					continue
				}
			}
		}
		cfg, err := s.topicConfig(b, m.Topic)
		if err != nil {
			var de *relay.DestinationError
			switch {
			case errors.Is(err, broker.ErrInvalidTopic):
				res.Failed[i] = err
				continue
			case errors.As(err, &de):
				if !waiting[m.Topic] {
					waiting[m.Topic] = true
					waits = append(waits, de)
				}
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
		gi, ok := s.groupOf[k]
		if !ok {
			if gi = ngroups; gi == len(s.groups) {
				s.groups = append(s.groups, group{})
			}
			seq, ok := s.seq[k]
			if !ok {
				seq = s.firstSeq
			}
			s.groups[gi] = group{key: k, indexes: s.groups[gi].indexes[:0], seq: seq}
			s.groupOf[k] = gi
			ngroups++
		}
		s.groups[gi].indexes = append(s.groups[gi].indexes, i)
	}
	if len(waits) > 0 {
		// The batch comes again: the events it skipped are still to be
		// recognised then.
		for _, id := range skipped {
			s.seen[id] = s.held[id] // held until a durable batch offers it
		}
		return nil, errors.Join(waits...)
	}
	if len(skipped) > 0 {
		s.cfg.Logger.Info("skipped re-delivered events the log already holds", "events", len(skipped))
	}
	if placements {
		res.Placements = relay.NewPlacements(len(msgs))
	}
	batches, err := s.appendGroups(ctx, b, fence, msgs, s.groups[:ngroups], res.Placements)
	if err != nil {
		return nil, err
	}
	return func() (relay.PublishResult, error) {
		var errs []error
		for _, a := range batches {
			if err := a.wait(); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			err = fmt.Errorf("embedded sink: making a batch durable: %w", err)
			s.setFailure(err)
			return relay.PublishResult{}, err
		}
		s.setFailure(nil)
		// The waits run in PublishAsync's order and only here, so s.st
		// only moves forward; the encoded copy goes with this batch's
		// acknowledgement.
		for _, a := range batches {
			s.st.setAcked(a.key, a.end)
		}
		for _, id := range skipped {
			delete(s.held, id)
		}
		state, err := s.st.withHeld(s.held).appendJSON(nil)
		if err != nil {
			return relay.PublishResult{}, err
		}
		res.State = state
		return res, nil
	}, nil
}

// appendGroups appends each group's messages, the groups split among up
// to appendWorkers goroutines when there are many (see "Appends side by
// side"), and returns the batches appended: one partition's in the order
// they were appended, the partitions in no particular order. placed, when
// not nil, gets each appended message's placement (the workers write
// disjoint entries).
func (s *Sink) appendGroups(ctx context.Context, b *broker.Broker, fence func() error, msgs []relay.Message, groups []group, placed []relay.Placement) ([]appended, error) {
	workers := min(appendWorkers, runtime.GOMAXPROCS(0), (len(groups)+groupsPerWorker-1)/groupsPerWorker)
	workers = max(workers, 1)
	for len(s.appenders) < workers {
		s.appenders = append(s.appenders, appender{})
	}
	var (
		next      atomic.Int64
		failed    atomic.Bool
		appendErr atomic.Bool // a failed append, not a lost fence
		wg        sync.WaitGroup
		errs      = make([]error, workers)
	)
	work := func(w int) {
		a := &s.appenders[w]
		a.batches = a.batches[:0]
		for !failed.Load() {
			from := int(next.Add(appendChunk)) - appendChunk
			if from >= len(groups) {
				return
			}
			for gi := from; gi < min(from+appendChunk, len(groups)); gi++ {
				err := fence()
				if err != nil {
					err = fmt.Errorf("embedded sink: not appending: %w", err)
				} else if err = a.appendGroup(ctx, b, s.id, &groups[gi], msgs, placed); err != nil {
					appendErr.Store(true)
				}
				if err != nil {
					errs[w] = err
					failed.Store(true)
					return
				}
			}
		}
	}
	for w := 1; w < workers; w++ {
		wg.Go(func() { work(w) })
	}
	work(0)
	wg.Wait()
	for _, g := range groups {
		s.seq[g.key] = g.seq
	}
	if err := errors.Join(errs...); err != nil {
		if appendErr.Load() {
			s.setFailure(err)
		}
		return nil, err
	}
	n := 0
	for w := range workers {
		n += len(s.appenders[w].batches)
	}
	batches := make([]appended, 0, n)
	for w := range workers {
		batches = append(batches, s.appenders[w].batches...)
		clear(s.appenders[w].batches)
	}
	return batches, nil
}

// appender is one append worker's scratch, reused from batch to batch:
// with a batch for each of thousands of partitions, allocating the
// records, headers and encoding buffer anew was a visible share of the
// sink's CPU time per event. Each worker keeps an encoding buffer of up
// to maxEncodeBuffer, so the sink holds at most appendWorkers of them.
type appender struct {
	records []broker.Record
	headers []broker.Header
	enc     []byte
	// batches are the batches this worker appended in this call.
	batches []appended
}

// appendGroup writes one partition's messages, splitting batches that
// exceed the topic's size limit, and adds each batch to a.batches.
func (a *appender) appendGroup(ctx context.Context, b *broker.Broker, id broker.ProducerID, g *group, msgs []relay.Message, placed []relay.Placement) error {
	var appendRange func(idx []int) error
	appendRange = func(idx []int) error {
		if len(idx) == 0 {
			return nil
		}
		records, headers := a.records[:0], a.headers[:0]
		for _, i := range idx {
			var r broker.Record
			r, headers = appendRecord(msgs[i], headers)
			records = append(records, r)
		}
		a.records, a.headers = records, headers
		batch, err := broker.AppendBatch(a.enc[:0], broker.BatchOptions{ProducerID: id.ID, ProducerEpoch: id.Epoch, BaseSequence: g.seq}, records)
		// Encoded: the scratch lets go of the messages' bytes, which an
		// idle relay would otherwise hold until the next batch.
		clear(records)
		clear(headers)
		if err != nil {
			return fmt.Errorf("embedded sink: encoding a batch: %w", err)
		}
		// The broker has written (and the journal copied) the batch when
		// AppendAsync returns, so the buffer serves the next one.
		if cap(batch) <= maxEncodeBuffer {
			a.enc = batch
		}
		res, wait, err := b.AppendAsync(ctx, g.key.topic, g.key.partition, batch)
		switch {
		case err == nil:
			g.seq = nextSeq(g.seq, len(idx))
			a.batches = append(a.batches, appended{key: g.key, wait: wait, end: res.BaseOffset + int64(len(idx))})
			if placed != nil {
				for j, i := range idx {
					placed[i] = relay.Placement{Partition: g.key.partition, Offset: res.BaseOffset + int64(j)}
				}
			}
			return nil
		case errors.Is(err, broker.ErrMessageTooLarge) && len(idx) > 1:
			half := len(idx) / 2
			if err := appendRange(idx[:half]); err != nil {
				return err
			}
			return appendRange(idx[half:])
		default:
			return fmt.Errorf("embedded sink: appending to %s/%d: %w", g.key.topic, g.key.partition, err)
		}
	}
	return appendRange(g.indexes)
}

// nextSeq advances a Kafka sequence by n records; sequences wrap from
// MaxInt32 to 0.
func nextSeq(seq int32, n int) int32 {
	return int32((int64(seq) + int64(n)) % (1 << 31))
}

// partitionKey is what the partitioner hashes: the key, or for a keyless
// message its event id.
func partitionKey(m relay.Message) []byte {
	if m.Key != nil {
		return m.Key
	}
	return m.EventID()
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
