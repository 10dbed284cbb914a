package kafka

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/relay"
)

var _ relay.PipelinedSink = (*Sink)(nil)

// PublishAsync hands msgs to the client behind every earlier batch and
// returns; its wait returns once Kafka acknowledged every record of the
// batch (acks=all), or the error that broke the session. See the package
// documentation's fault model. In the exactly-once mode, and for a batch
// naming a topic that failed while producing, it publishes the batch
// before it returns, as Publish does.
func (s *Sink) PublishAsync(ctx context.Context, msgs []relay.Message) (func() (relay.PublishResult, error), error) {
	if s.cfg.TransactionalID != "" || s.namesSyncTopic(msgs) {
		res, err := s.Publish(ctx, msgs)
		if err != nil {
			return nil, err
		}
		s.clearSyncTopics(msgs)
		return func() (relay.PublishResult, error) { return res, nil }, nil
	}
	cl, err := s.client()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(s.cfg.PublishTimeout)
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	failed := map[int]error{}
	idx, err := s.admit(actx, msgs, s.undelivered(msgs), failed)
	if err != nil {
		return nil, err
	}
	if err := s.dialer.check(); err != nil {
		return nil, s.breakWith(fmt.Errorf("kafka sink: not producing: %w", err))
	}
	s.mu.Lock()
	sess := s.sess
	s.mu.Unlock()
	b := &inflight{s: s, sess: sess, ctx: ctx, msgs: msgs, idx: idx, failed: failed, deadline: deadline,
		errs: make([]error, len(idx)), done: make(chan struct{}), placed: s.newPlacements(len(msgs))}
	if len(idx) == 0 {
		close(b.done)
		return b.wait, nil
	}
	b.left.Store(int64(len(idx)))
	sess.outstanding.Add(int64(len(idx)))
	for j, i := range idx {
		cl.Produce(sess.ctx, toRecord(msgs[i]), func(r *kgo.Record, err error) {
			if b.placed != nil && err == nil {
				b.placed[i] = relay.Placement{Partition: r.Partition, Offset: r.Offset}
			}
			b.resolve(j, err)
		})
	}
	return b.wait, nil
}

// session is what lives from Start to Close in the at-least-once mode's
// pipelined path.
type session struct {
	// ctx is every record's context: cancelled when the session breaks or
	// closes, it fails what the client still buffers.
	ctx    context.Context
	cancel context.CancelFunc
	// dialer is the session's fenced dialer.
	dialer *fencedDialer
	// broken is closed when the session breaks (Sink.breakSession), err
	// is why.
	once   sync.Once
	broken chan struct{}
	err    error
	// outstanding counts records handed to the client and not resolved.
	outstanding atomic.Int64
	// watched ends the fence watcher.
	watched chan struct{}
}

// watchFence checks the fence every fenceCheckInterval while records are
// outstanding and breaks the session when it fails (check has reset the
// connections by then), until the session ends.
func (s *Sink) watchFence(sess *session) {
	t := time.NewTicker(fenceCheckInterval)
	defer t.Stop()
	defer close(sess.watched)
	for {
		select {
		case <-sess.ctx.Done():
			return
		case <-t.C:
		}
		if sess.outstanding.Load() == 0 {
			continue
		}
		if err := sess.dialer.check(); err != nil {
			s.breakSession(sess, fmt.Errorf("kafka sink: records not acknowledged before the lease ended: %w", err))
			return
		}
	}
}

// inflight is one batch PublishAsync handed to the client.
type inflight struct {
	s        *Sink
	sess     *session
	ctx      context.Context
	msgs     []relay.Message
	idx      []int
	failed   map[int]error
	deadline time.Time

	errs []error
	left atomic.Int64
	done chan struct{}
	// placed is where each record landed, when the session asked.
	placed []relay.Placement
}

// resolve is the client's verdict on the record at idx[j]. Any failure
// but a topic's refusal of every record breaks the session at once: the
// connections are reset before the client can send the partition's later
// records under a new epoch (see the package documentation).
func (b *inflight) resolve(j int, err error) {
	b.errs[j] = err
	if err != nil && !isTopicRefusal(err) {
		b.sess.dialer.abort(fmt.Errorf("kafka sink: a record failed: %w", err))
		b.s.breakSession(b.sess, fmt.Errorf("kafka sink: topic %s: %w", b.msgs[b.idx[j]].Topic, err))
	}
	b.sess.outstanding.Add(-1)
	if b.left.Add(-1) == 0 {
		close(b.done)
	}
}

// wait returns the batch's result once every record is resolved; an error
// once the session broke or the deadline passed with records unresolved.
func (b *inflight) wait() (relay.PublishResult, error) {
	timer := time.NewTimer(time.Until(b.deadline))
	defer timer.Stop()
	select {
	case <-b.done:
	case <-b.sess.broken:
		select {
		case <-b.done:
		default:
			return relay.PublishResult{}, fmt.Errorf("kafka sink: the session broke before the batch was acknowledged: %w", b.sess.err)
		}
	case <-timer.C:
		return relay.PublishResult{}, b.s.breakSession(b.sess, fmt.Errorf("kafka sink: %d records not acknowledged within %v", b.left.Load(), b.s.cfg.PublishTimeout))
	case <-b.ctx.Done():
		return relay.PublishResult{}, b.s.breakSession(b.sess, fmt.Errorf("kafka sink: records not acknowledged: %w", context.Cause(b.ctx)))
	}
	var first error
	for j, i := range b.idx {
		err := b.errs[j]
		if err == nil {
			continue
		}
		t := b.msgs[i].Topic
		if isTopicRefusal(err) {
			b.failed[i] = fmt.Errorf("kafka sink: topic %s: %w", t, err)
			b.s.refuseTopic(t, b.failed[i])
			continue
		}
		if destinationError(t, err) != nil {
			b.s.addSyncTopic(t)
		}
		if first == nil {
			first = fmt.Errorf("kafka sink: topic %s: %w", t, err)
		}
	}
	if first != nil {
		return relay.PublishResult{}, b.s.breakSession(b.sess, first)
	}
	return relay.PublishResult{Failed: b.failed, Placements: b.placed}, nil
}

// namesSyncTopic reports whether msgs name a topic that failed while
// producing: such a batch is published before PublishAsync returns, so
// that the destination's refusal waits without repeating what Kafka took.
func (s *Sink) namesSyncTopic(msgs []relay.Message) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.syncTopics) == 0 {
		return false
	}
	for _, m := range msgs {
		if s.syncTopics[m.Topic] {
			return true
		}
	}
	return false
}

func (s *Sink) addSyncTopic(t string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.syncTopics == nil {
		s.syncTopics = map[string]bool{}
	}
	s.syncTopics[t] = true
}

// clearSyncTopics: the topics of msgs took a batch; they pipeline again.
func (s *Sink) clearSyncTopics(msgs []relay.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range msgs {
		delete(s.syncTopics, m.Topic)
	}
}

// refuseTopic caches that every record for t is refused.
func (s *Sink) refuseTopic(t string, err error) {
	s.topicsMu.Lock()
	defer s.topicsMu.Unlock()
	s.topics[t] = topicInfo{refused: err}
}
