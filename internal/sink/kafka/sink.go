package kafka

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/relay"
)

// ErrTopicMissing: the topic does not exist and CreateTopics is off. It is
// a fact about the cluster, not about the events: Publish returns it in a
// relay.DestinationError, and the core keeps the events in the outbox
// until the topic exists.
var ErrTopicMissing = errors.New("topic does not exist on the Kafka cluster")

// Errors a Publish reports per message in PublishResult.Failed; the core
// moves those messages to the dead letters. They wrap kerr errors where
// Kafka said so.
var (
	// ErrRecordTooLarge: the record alone is over the topic's
	// max.message.bytes (or BatchMaxBytes).
	ErrRecordTooLarge = errors.New("record is larger than the topic accepts")
	// ErrKeylessCompacted: a compacted topic refuses records without a key.
	ErrKeylessCompacted = errors.New("a compacted topic refuses a record without a key")
	// ErrInvalidTopic: the name breaks Kafka's topic rules.
	ErrInvalidTopic = errors.New("invalid topic name")
)

// Sink publishes to Apache Kafka (or anything speaking its protocol)
// through franz-go. It is a relay.PipelinedSink; see the package documentation for
// its guarantees.
type Sink struct {
	cfg   Config
	codec kgo.CompressionCodec
	// placements is the session's relay.Session.Placements: results
	// report each record's partition and offset.
	placements bool

	mu  sync.Mutex
	cl  *kgo.Client
	adm *kadm.Client
	// broken is set when a Publish left the client in a state it cannot
	// continue from (records still buffered or a transaction open); every
	// later Publish refuses until the core restarts the sink.
	broken error
	// started is set once Start has finished (recovery included): Ready
	// fails before, so a relay is not reported ready while it still reads
	// the progress markers.
	started bool
	// topics caches what the cluster said about each topic this session;
	// a topic the cluster refuses for now (relay.DestinationError) is never
	// cached, so every Publish asks again. Its lock is held by admit and
	// by whoever records a refusal (a wait, in another goroutine).
	topicsMu sync.Mutex
	topics   map[string]topicInfo
	// sess is the session's record context, breakage and fence watcher.
	sess *session
	// syncTopics are the topics that failed while producing a pipelined
	// batch: batches naming them are published synchronously until one
	// goes through. It survives restarts of the sink.
	syncTopics map[string]bool
	// delivered holds the identities of messages Kafka acknowledged in a
	// Publish that then returned a relay.DestinationError (at-least-once
	// mode): the core offers the same batch again, and those are not
	// produced a second time. Emptied by Start.
	delivered map[string]struct{}
	// limits is the per-topic batch size cap handed to the client; read by
	// the client's goroutines, hence its own lock.
	limitsMu sync.Mutex
	limits   map[string]int32

	// txn is the exactly-once progress, nil in at-least-once mode.
	txn *txnState
	// dialer holds the producing client's connections under the session's
	// leadership fence: checked before records are handed to the client,
	// while their acknowledgements are awaited, at every dial and every
	// write. Once it fails nothing more is written to a broker (see the
	// package documentation's fault model).
	dialer *fencedDialer
}

// topicInfo is one topic's answer: either its limits or why every record
// for it is refused.
type topicInfo struct {
	maxBytes  int32
	compacted bool
	refused   error
}

// maxBufferedRecords is the most records the client buffers before
// Produce blocks: four batches of the core's largest batch size.
const maxBufferedRecords = 4 * 100_000

// New returns a sink; Start connects it.
func New(cfg Config) (*Sink, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	codec, _ := compressionCodec(cfg.Compression)
	if _, err := cfg.clientOpts(); err != nil {
		return nil, err
	}
	return &Sink{cfg: cfg, codec: codec}, nil
}

// Start connects to the cluster and, in exactly-once mode, fences any
// earlier relay with the same transactional id and reads what it
// committed after the saved state. It fails when no broker answers.
func (s *Sink) Start(ctx context.Context, rs relay.Session) error {
	s.Close(ctx)
	saved := rs.State
	var tc *tls.Config
	if s.cfg.TLS.enabled() {
		var err error
		if tc, err = s.cfg.tlsConfig(); err != nil {
			return err
		}
	}
	s.dialer = newFencedDialer(rs.CheckFence, s.cfg.DialTimeout, tc)
	s.placements = rs.Placements
	opts, err := s.cfg.clientOptsDialing(s.dialer)
	if err != nil {
		return err
	}
	opts = append(opts,
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchCompression(s.codec),
		kgo.ProducerLinger(s.cfg.Linger),
		kgo.ProducerBatchMaxBytesFn(s.batchMaxBytes),
		kgo.RecordPartitioner(partitioner()),
		kgo.ProduceRequestTimeout(s.cfg.PublishTimeout),
		// The core bounds what is in flight (four batches, its byte
		// budget); the client's own default of 10,000 records would
		// block PublishAsync behind a few batches.
		kgo.MaxBufferedRecords(maxBufferedRecords),
	)
	if s.cfg.TransactionalID != "" {
		opts = append(opts,
			kgo.TransactionalID(s.cfg.TransactionalID),
			kgo.TransactionTimeout(max(2*s.cfg.PublishTimeout, time.Minute)),
		)
	}
	s.limitsMu.Lock()
	s.limits = map[string]int32{}
	s.limitsMu.Unlock()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka sink: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, s.cfg.DialTimeout)
	err = cl.Ping(pingCtx)
	cancel()
	if err != nil {
		cl.Close()
		return fmt.Errorf("kafka sink: no broker of %s answers: %w", strings.Join(s.cfg.Brokers, ","), err)
	}
	adm := kadm.NewClient(cl)
	sess := &session{dialer: s.dialer, broken: make(chan struct{}), watched: make(chan struct{})}
	sess.ctx, sess.cancel = context.WithCancel(context.WithoutCancel(ctx))
	s.topicsMu.Lock()
	s.topics = map[string]topicInfo{}
	s.topicsMu.Unlock()
	s.mu.Lock()
	s.cl, s.adm, s.broken, s.txn, s.started, s.sess = cl, adm, nil, nil, false, sess
	s.delivered = map[string]struct{}{}
	s.mu.Unlock()
	go s.watchFence(sess)
	var st *txnState
	if s.cfg.TransactionalID != "" {
		if st, err = s.recover(ctx, saved); err != nil {
			s.Close(ctx)
			return err
		}
	}
	s.mu.Lock()
	s.txn, s.started = st, true
	s.mu.Unlock()
	return nil
}

func (s *Sink) client() (*kgo.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cl == nil {
		return nil, errors.New("kafka sink: not started")
	}
	if s.broken != nil {
		return nil, fmt.Errorf("kafka sink: an earlier publish failed; waiting for a restart: %w", s.broken)
	}
	return s.cl, nil
}

// breakWith marks the session broken with err (the first error wins):
// every later Publish and PublishAsync refuses, every wait of a batch not
// yet acknowledged fails, and the client fails what it still buffers.
func (s *Sink) breakWith(err error) error {
	s.mu.Lock()
	sess := s.sess
	s.mu.Unlock()
	return s.breakSession(sess, err)
}

// breakSession is breakWith for sess only: a late callback of a session
// already closed leaves the current one alone.
func (s *Sink) breakSession(sess *session, err error) error {
	s.mu.Lock()
	if s.sess == sess && s.broken == nil {
		s.broken = err
	}
	s.mu.Unlock()
	if sess != nil {
		sess.once.Do(func() {
			sess.err = err
			close(sess.broken)
			sess.cancel()
		})
	}
	return err
}

// batchMaxBytes is the client's per-topic batch cap: the smaller of
// BatchMaxBytes and the topic's max.message.bytes.
func (s *Sink) batchMaxBytes(topic string) int32 {
	s.limitsMu.Lock()
	defer s.limitsMu.Unlock()
	if n, ok := s.limits[topic]; ok {
		return n
	}
	if s.cfg.BatchMaxBytes > 0 {
		return s.cfg.BatchMaxBytes
	}
	return DefaultMaxMessageBytes
}

// Publish produces msgs and returns once the cluster acknowledged every one
// (acks=all), or once it is clear which can never be published. Messages of
// one partition keep their order. An error means nothing is confirmed: the
// core re-delivers the batch after restarting the sink.
func (s *Sink) Publish(ctx context.Context, msgs []relay.Message) (relay.PublishResult, error) {
	cl, err := s.client()
	if err != nil {
		return relay.PublishResult{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	res := relay.PublishResult{Failed: map[int]error{}}
	if s.cfg.TransactionalID != "" {
		return s.publishTxn(ctx, cl, msgs, res)
	}
	idx, err := s.admit(ctx, msgs, s.undelivered(msgs), res.Failed)
	if err != nil {
		return relay.PublishResult{}, err
	}
	res.Placements = s.newPlacements(len(msgs))
	errs, err := s.produce(ctx, cl, msgs, idx, nil, res.Placements)
	if err != nil {
		return relay.PublishResult{}, s.breakWith(err)
	}
	if err := s.classify(msgs, idx, errs, res.Failed); err != nil {
		if relay.DestinationErrors(err) != nil {
			// Every record is resolved and the client holds nothing:
			// it goes on, and what Kafka took is not produced again
			// when the core offers the batch anew.
			for j, i := range idx {
				if id := msgs[i].Identity(); errs[j] == nil && id != "" {
					s.delivered[id] = struct{}{}
				}
			}
			return relay.PublishResult{}, err
		}
		return relay.PublishResult{}, s.breakWith(err)
	}
	// The batch is published: what s.delivered held was of it.
	clear(s.delivered)
	return res, nil
}

// newPlacements returns n unknown placements when the session asked for
// them, else nil.
func (s *Sink) newPlacements(n int) []relay.Placement {
	if !s.placements {
		return nil
	}
	return relay.NewPlacements(n)
}

// undelivered returns the indexes of msgs to produce: all but those in
// s.delivered (they count as published; the set keeps them until the
// batch is through, in case the destination refuses it once more).
func (s *Sink) undelivered(msgs []relay.Message) []int {
	idx := make([]int, 0, len(msgs))
	for i, m := range msgs {
		if len(s.delivered) > 0 {
			if _, ok := s.delivered[m.Identity()]; ok {
				continue
			}
		}
		idx = append(idx, i)
	}
	return idx
}

func allIndexes(n int) []int {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// admit checks the messages at idx against their topics and returns those
// to produce; refusals go into failed. An error means the cluster could
// not be asked.
func (s *Sink) admit(ctx context.Context, msgs []relay.Message, idx []int, failed map[int]error) ([]int, error) {
	s.topicsMu.Lock()
	defer s.topicsMu.Unlock()
	var unknown []string
	seen := map[string]bool{}
	for _, i := range idx {
		t := msgs[i].Topic
		if _, ok := s.topics[t]; !ok && !seen[t] {
			seen[t] = true
			unknown = append(unknown, t)
		}
	}
	if err := s.lookupTopics(ctx, unknown); err != nil {
		return nil, err
	}
	out := idx[:0:0]
	for _, i := range idx {
		m := msgs[i]
		info := s.topics[m.Topic]
		switch {
		case info.refused != nil:
			failed[i] = info.refused
		case m.Key == nil && info.compacted:
			failed[i] = fmt.Errorf("kafka sink: topic %s: %w", m.Topic, ErrKeylessCompacted)
		case recordBatchSize(m) > int(info.maxBytes):
			failed[i] = fmt.Errorf("kafka sink: topic %s: %w: a %d-byte batch, the limit is %d",
				m.Topic, ErrRecordTooLarge, recordBatchSize(m), info.maxBytes)
		default:
			out = append(out, i)
		}
	}
	return out, nil
}

// lookupTopics asks the cluster about topics not yet in the cache: does
// each exist (creating it when configured), and what are its limits.
func (s *Sink) lookupTopics(ctx context.Context, names []string) (err error) {
	if len(names) == 0 {
		return nil
	}
	var ask []string
	for _, t := range names {
		if err := validTopic(t); err != nil {
			s.topics[t] = topicInfo{refused: fmt.Errorf("kafka sink: topic %q: %w", t, err)}
			continue
		}
		ask = append(ask, t)
	}
	if len(ask) == 0 {
		return nil
	}
	details, err := s.topicErrors(ctx, ask)
	if err != nil {
		return fmt.Errorf("kafka sink: reading topic metadata: %w", err)
	}
	var create, exist []string
	// waits are the topics the cluster refuses for now; they are not
	// cached, so the next Publish asks again.
	var waits []error
	for _, t := range ask {
		dErr, ok := details[t]
		switch {
		case ok && dErr == nil:
			exist = append(exist, t)
		case !ok || errors.Is(dErr, kerr.UnknownTopicOrPartition):
			if !s.cfg.CreateTopics {
				waits = append(waits, &relay.DestinationError{Topic: t, Reason: relay.WaitTopicMissing,
					Err: fmt.Errorf("kafka sink: topic %s: %w; its events wait in the outbox until it exists (create it, or let the relay create topics)", t, ErrTopicMissing)})
				continue
			}
			create = append(create, t)
		case isTopicRefusal(dErr):
			s.topics[t] = topicInfo{refused: fmt.Errorf("kafka sink: topic %s: %w", t, dErr)}
		default:
			if de := destinationError(t, dErr); de != nil {
				waits = append(waits, de)
				continue
			}
			return fmt.Errorf("kafka sink: topic %s: %w", t, dErr)
		}
	}
	if len(create) > 0 {
		resp, err := s.adm.CreateTopics(ctx, s.cfg.Partitions, s.cfg.ReplicationFactor, nil, create...)
		if err != nil {
			return fmt.Errorf("kafka sink: creating topics %v: %w", create, err)
		}
		for _, t := range create {
			r := resp[t]
			switch {
			case r.Err == nil:
				s.cfg.Logger.Info("created Kafka topic", "topic", t, "partitions", r.NumPartitions, "replication_factor", r.ReplicationFactor)
				exist = append(exist, t)
			case errors.Is(r.Err, kerr.TopicAlreadyExists):
				exist = append(exist, t)
			case isTopicRefusal(r.Err):
				s.topics[t] = topicInfo{refused: fmt.Errorf("kafka sink: creating topic %s: %w", t, r.Err)}
			case errors.Is(r.Err, kerr.ClusterAuthorizationFailed):
				waits = append(waits, destinationError(t, kerr.TopicAuthorizationFailed))
			default:
				if de := destinationError(t, r.Err); de != nil {
					de.Err = fmt.Errorf("kafka sink: creating topic %s: %w %s", t, r.Err, r.ErrMessage)
					waits = append(waits, de)
					continue
				}
				return fmt.Errorf("kafka sink: creating topic %s: %w %s", t, r.Err, r.ErrMessage)
			}
		}
	}
	defer func() {
		if err == nil {
			err = errors.Join(waits...)
		}
	}()
	configs := s.describeTopics(ctx, exist)
	for _, t := range exist {
		info := configs[t]
		limit := info.maxBytes
		if limit <= 0 {
			limit = DefaultMaxMessageBytes
		}
		if s.cfg.BatchMaxBytes > 0 {
			limit = min(limit, s.cfg.BatchMaxBytes)
		}
		info.maxBytes = max(limit, 512)
		s.topics[t] = info
		s.limitsMu.Lock()
		s.limits[t] = info.maxBytes
		s.limitsMu.Unlock()
	}
	return nil
}

// topicErrors asks the cluster about topics with a Metadata request of
// its own, never the client's cached metadata (kadm's ListTopics may
// answer from a cache up to MetadataMinAge old, which would keep a topic
// created meanwhile missing for seconds): each topic maps to nil when it
// exists, else to the cluster's error for it; a topic absent from the
// answer is absent from the map.
func (s *Sink) topicErrors(ctx context.Context, topics []string) (map[string]error, error) {
	s.mu.Lock()
	cl := s.cl
	s.mu.Unlock()
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := make(map[string]error, len(resp.Topics))
	for _, t := range resp.Topics {
		if t.Topic != nil {
			out[*t.Topic] = kerr.ErrorForCode(t.ErrorCode)
		}
	}
	return out, nil
}

// describeTopics reads max.message.bytes and cleanup.policy; a cluster
// that will not say (an old or embedded broker, no DescribeConfigs ACL)
// leaves the defaults.
func (s *Sink) describeTopics(ctx context.Context, topics []string) map[string]topicInfo {
	out := map[string]topicInfo{}
	if len(topics) == 0 {
		return out
	}
	rcs, err := s.adm.DescribeTopicConfigs(ctx, topics...)
	if err != nil && len(rcs) == 0 {
		s.cfg.Logger.Debug("topic configs unavailable; assuming Kafka's defaults", "topics", topics, "err", err)
		return out
	}
	for _, rc := range rcs {
		if rc.Err != nil {
			continue
		}
		var info topicInfo
		for _, c := range rc.Configs {
			if c.Value == nil {
				continue
			}
			switch c.Key {
			case "max.message.bytes":
				if n, err := strconv.ParseInt(*c.Value, 10, 32); err == nil {
					info.maxBytes = int32(n)
				}
			case "cleanup.policy":
				info.compacted = strings.Contains(*c.Value, "compact")
			}
		}
		out[rc.Name] = info
	}
	return out
}

// isTopicRefusal reports errors after which no record for the topic can
// ever be written, whatever the retries: the name itself is refused (the
// relay checks Kafka's rules before, so this is a cluster's stricter
// rule, such as a name colliding with another's once '.' and '_' are
// equated).
func isTopicRefusal(err error) bool {
	return errors.Is(err, kerr.InvalidTopicException)
}

// destinationError returns err as a relay.DestinationError when it is a
// fact about the cluster that an operator (or time) changes, after which
// the same records are accepted: the table of errors in docs/operating.md says which
// and why. Nil for any other error.
func destinationError(topic string, err error) *relay.DestinationError {
	var reason string
	switch {
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		reason = relay.WaitUnauthorized
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.UnknownTopicID):
		reason = relay.WaitTopicMissing
	case errors.Is(err, kerr.PolicyViolation):
		reason = relay.WaitCreateRefused
	case errors.Is(err, kerr.ThrottlingQuotaExceeded):
		reason = relay.WaitThrottled
	default:
		return nil
	}
	return &relay.DestinationError{Topic: topic, Reason: reason, Err: fmt.Errorf("kafka sink: topic %s: %w; its events wait in the outbox", topic, err)}
}

// produce sends the messages at idx (and extra, when set, after them) and
// waits for every acknowledgement. It returns each record's error; the
// error return means the wait itself ended (ctx), with records unresolved.
// placed, when not nil, gets each acknowledged message's placement.
func (s *Sink) produce(ctx context.Context, cl *kgo.Client, msgs []relay.Message, idx []int, extra *kgo.Record, placed []relay.Placement) ([]error, error) {
	n := len(idx)
	if extra != nil {
		n++
	}
	if err := s.dialer.check(); err != nil {
		return nil, fmt.Errorf("kafka sink: not producing: %w", err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	wg.Add(n)
	for j, i := range idx {
		cl.Produce(ctx, toRecord(msgs[i]), func(r *kgo.Record, err error) {
			errs[j] = err
			if placed != nil && err == nil {
				placed[i] = relay.Placement{Partition: r.Partition, Offset: r.Offset}
			}
			wg.Done()
		})
	}
	if extra != nil {
		cl.Produce(ctx, extra, func(_ *kgo.Record, err error) {
			errs[n-1] = err
			wg.Done()
		})
	}
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	fenced := time.NewTicker(fenceCheckInterval)
	defer fenced.Stop()
	for {
		select {
		case <-done:
			return errs, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("kafka sink: %d records not acknowledged in time: %w", n, context.Cause(ctx))
		case <-fenced.C:
			if err := s.dialer.check(); err != nil {
				// check reset the connections; what the client still
				// buffers is failed, never retried.
				cl.UnsafeAbortBufferedRecords()
				return nil, fmt.Errorf("kafka sink: %d records not acknowledged before the lease ended: %w", n, err)
			}
		}
	}
}

// classify turns per-record errors into refusals (failed) or, when any
// error might pass on a retry, one error for the whole Publish: the
// topics the cluster refuses for now, joined relay.DestinationErrors
// (one per topic), when nothing else failed.
func (s *Sink) classify(msgs []relay.Message, idx []int, errs []error, failed map[int]error) error {
	s.topicsMu.Lock()
	defer s.topicsMu.Unlock()
	var retry, waits []error
	waiting := map[string]bool{}
	// gone are topics deleted under the client: it keeps their old topic
	// ids and would refuse them (UNKNOWN_TOPIC_ID) even once recreated,
	// unless they are purged from it. Every record is resolved here, so
	// the purge fails none.
	var gone []string
	defer func() {
		if len(gone) > 0 {
			s.mu.Lock()
			cl := s.cl
			s.mu.Unlock()
			cl.PurgeTopicsFromClient(gone...)
		}
	}()
	for j, i := range idx {
		err := errs[j]
		if err == nil {
			continue
		}
		t := msgs[i].Topic
		if de := destinationError(t, err); de != nil {
			// Not cached: the next Publish asks the cluster again.
			delete(s.topics, t)
			if !waiting[t] {
				waiting[t] = true
				waits = append(waits, de)
				if de.Reason == relay.WaitTopicMissing {
					gone = append(gone, t)
				}
			}
			continue
		}
		switch {
		case isTopicRefusal(err):
			// Every record of the topic fails alike, so no record is
			// refused for another's fault; later batches skip the topic.
			failed[i] = fmt.Errorf("kafka sink: topic %s: %w", t, err)
			s.topics[t] = topicInfo{refused: failed[i]}
		case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.InvalidRecord), errors.Is(err, kerr.CorruptMessage):
			// The sink's own checks passed this record, so the broker
			// refused a whole batch: the other records in it are not at
			// fault, and refusing only some of them would reorder the
			// partition. Fail the publish loudly instead.
			retry = append(retry, fmt.Errorf("kafka sink: topic %s refused a batch (%w); the topic's limits are lower than the sink knows: set the batch max bytes below the topic's max.message.bytes", t, err))
		default:
			retry = append(retry, fmt.Errorf("kafka sink: topic %s: %w", t, err))
		}
	}
	if len(retry) > 0 {
		return fmt.Errorf("%w (and %d more record errors)", retry[0], len(retry)-1)
	}
	return errors.Join(waits...)
}

// Ready asks the cluster for its brokers, within a few seconds.
func (s *Sink) Ready(ctx context.Context) error {
	cl, err := s.client()
	if err != nil {
		return err
	}
	s.mu.Lock()
	started := s.started
	s.mu.Unlock()
	if !started {
		return errors.New("kafka sink: starting")
	}
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.DialTimeout, 5*time.Second))
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		return fmt.Errorf("kafka sink: no broker answers: %w", err)
	}
	return nil
}

// Close releases the client. Records not acknowledged are abandoned; the
// core re-delivers them.
func (s *Sink) Close(context.Context) error {
	s.mu.Lock()
	cl, sess := s.cl, s.sess
	s.cl, s.adm, s.started, s.sess = nil, nil, false, nil
	s.mu.Unlock()
	if sess != nil {
		sess.cancel()
		<-sess.watched
	}
	if cl != nil {
		cl.Close()
	}
	return nil
}
