package kafka

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/relay"
)

// digest names one publication in progress markers and in the saved
// state: the first 16 bytes of the SHA-256 of its identity, the event id
// and, for a replay, the replay request (of its whole content when it has
// no event id). A first publication hashes as it did before replays had
// their own identity, so markers and states written then still match.
type digest [16]byte

func digestOf(m relay.Message) digest {
	h := sha256.New()
	if id, replay := identityOf(m); id != nil {
		if replay == nil {
			h.Write([]byte{1})
			h.Write(id)
		} else {
			h.Write([]byte{2})
			h.Write(binary.AppendUvarint(nil, uint64(len(id))))
			h.Write(id)
			h.Write(replay)
		}
	} else {
		h.Write([]byte{0})
		for _, b := range [][]byte{[]byte(m.Topic), m.Key, m.Value, []byte(m.Timestamp.UTC().String())} {
			h.Write(binary.AppendVarint(nil, int64(len(b))))
			h.Write(b)
		}
		for _, hd := range m.Headers {
			h.Write(binary.AppendVarint(nil, int64(len(hd.Key))))
			h.Write([]byte(hd.Key))
			h.Write(binary.AppendVarint(nil, int64(len(hd.Value))))
			h.Write(hd.Value)
		}
	}
	var d digest
	copy(d[:], h.Sum(nil))
	return d
}

// identityOf returns the relay's event id and replay request headers of m
// (nil when absent), the parts of relay.Message.Identity: the core appends
// its headers after the row's own, so the last of each name is the
// relay's.
func identityOf(m relay.Message) (id, replay []byte) {
	for i := len(m.Headers) - 1; i >= 0 && (id == nil || replay == nil); i-- {
		switch m.Headers[i].Key {
		case relay.HeaderEventID:
			if id == nil {
				id = m.Headers[i].Value
			}
		case relay.HeaderReplay:
			if replay == nil {
				replay = m.Headers[i].Value
			}
		}
	}
	if len(id) == 0 {
		return nil, nil
	}
	return id, replay
}

// Progress records in ProgressTopic, keyed by the transactional id:
//
//	version 1 (1 byte) | kind (1 byte) | body
//	kind 1, a marker: sequence uint64 | count uint32 | count digests of 16 bytes
//	kind 2, a start:  16 random bytes
//
// Integers are big-endian. A marker commits in the same transaction as the
// events it names; a start is committed by Start to fence earlier
// producers and to know where the log ends.
const (
	progressVersion = 1
	kindMarker      = 1
	kindStart       = 2
)

func encodeMarker(seq uint64, ds []digest) []byte {
	b := make([]byte, 0, 2+8+4+16*len(ds))
	b = append(b, progressVersion, kindMarker)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ds)))
	for _, d := range ds {
		b = append(b, d[:]...)
	}
	return b
}

// decodeMarker returns a marker's sequence and digests; ok is false for a
// start record or anything it does not know.
func decodeMarker(b []byte) (seq uint64, ds []digest, ok bool, err error) {
	if len(b) < 2 || b[0] != progressVersion || b[1] != kindMarker {
		return 0, nil, false, nil
	}
	b = b[2:]
	if len(b) < 12 {
		return 0, nil, false, errors.New("short progress marker")
	}
	seq = binary.BigEndian.Uint64(b)
	n := binary.BigEndian.Uint32(b[8:])
	b = b[12:]
	if uint64(len(b)) != 16*uint64(n) {
		return 0, nil, false, fmt.Errorf("progress marker says %d events but holds %d bytes", n, len(b))
	}
	ds = make([]digest, n)
	for i := range ds {
		copy(ds[i][:], b[16*i:])
	}
	return seq, ds, true, nil
}

func encodeStart() []byte {
	b := []byte{progressVersion, kindStart}
	var nonce [16]byte
	rand.Read(nonce[:])
	return append(b, nonce[:]...)
}

// pendingHorizon is how many messages the sink publishes after learning
// of committed events before it stops waiting for them to be re-delivered
// (see the package documentation).
const pendingHorizon = 1_000_000

// txnState is the exactly-once mode's progress, saved by the core with
// each acknowledgement.
type txnState struct {
	V               int    `json:"v"`
	TransactionalID string `json:"transactional_id"`
	ProgressTopic   string `json:"progress_topic"`
	Partition       int32  `json:"partition"`
	// Offset is the progress record up to which every marker of this
	// transactional id is accounted for: its events were acknowledged, or
	// are in Pending.
	Offset int64 `json:"offset"`
	// Seq counts the transactions committed.
	Seq uint64 `json:"seq"`
	// Pending are digests of events committed to Kafka whose
	// re-delivery has not been seen yet: they are skipped when it comes.
	Pending []byte `json:"pending,omitempty"`
	// PendingAge counts messages published since Pending last grew.
	PendingAge int64 `json:"pending_age,omitempty"`

	pending map[digest]struct{}
}

func (st *txnState) clone() *txnState {
	c := *st
	c.Pending = nil
	c.pending = maps.Clone(st.pending)
	return &c
}

func (st *txnState) encode() []byte {
	st.Pending = make([]byte, 0, 16*len(st.pending))
	for d := range st.pending {
		st.Pending = append(st.Pending, d[:]...)
	}
	b, _ := json.Marshal(st)
	st.Pending = nil
	return b
}

// decodeState reads a saved state; nil when there is none or it is not
// this mode's (another sink's, or a different transactional id).
func decodeState(saved []byte, txnID, topic string) (*txnState, error) {
	if saved == nil {
		return nil, nil
	}
	var st txnState
	if err := json.Unmarshal(saved, &st); err != nil {
		return nil, fmt.Errorf("kafka sink: the saved state is not the exactly-once mode's: %w", err)
	}
	if st.V != 1 || st.TransactionalID != txnID || st.ProgressTopic != topic {
		return nil, nil
	}
	if len(st.Pending)%16 != 0 {
		return nil, errors.New("kafka sink: the saved state's pending digests are damaged")
	}
	st.pending = make(map[digest]struct{}, len(st.Pending)/16)
	for i := 0; i < len(st.Pending); i += 16 {
		st.pending[digest(st.Pending[i:i+16])] = struct{}{}
	}
	st.Pending = nil
	return &st, nil
}

// recover fences earlier producers with this transactional id, then reads
// the markers they committed after the saved state, so that Publish skips
// their events when the core re-delivers them.
func (s *Sink) recover(ctx context.Context, saved []byte) (*txnState, error) {
	id, topic := s.cfg.TransactionalID, s.cfg.ProgressTopic
	ctx, cancel := context.WithTimeout(ctx, 2*s.cfg.PublishTimeout)
	defer cancel()
	st, err := decodeState(saved, id, topic)
	if err != nil {
		return nil, err
	}
	if st == nil && saved != nil {
		s.cfg.Logger.Warn("the saved sink state is not this exactly-once relay's (another sink, transactional id or progress topic); reading every progress marker",
			"transactional_id", id, "progress_topic", topic)
	}
	if err := s.ensureProgressTopic(ctx); err != nil {
		return nil, err
	}

	// Committing a transaction makes sure the client holds the newest
	// epoch of the id: an earlier relay's open transaction is aborted (or
	// its commit completed) and it can commit nothing more. The start
	// record then marks where the log stood.
	s.mu.Lock()
	cl := s.cl
	s.mu.Unlock()
	if err := cl.BeginTransaction(); err != nil {
		return nil, fmt.Errorf("kafka sink: beginning a transaction: %w", err)
	}
	start := &kgo.Record{Topic: topic, Key: []byte(id), Value: encodeStart()}
	if err := cl.ProduceSync(ctx, start).FirstErr(); err != nil {
		cl.EndTransaction(context.WithoutCancel(ctx), kgo.TryAbort)
		return nil, fmt.Errorf("kafka sink: writing to the progress topic %s: %w", topic, err)
	}
	if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return nil, fmt.Errorf("kafka sink: committing the start transaction: %w", err)
	}

	fresh := st == nil
	if st != nil && st.Partition != start.Partition {
		s.cfg.Logger.Warn("the progress topic's partitioning changed; reading every progress marker", "progress_topic", topic)
		fresh = true
	}
	if fresh {
		st = &txnState{V: 1, TransactionalID: id, ProgressTopic: topic, Offset: -1, pending: map[digest]struct{}{}}
	}
	from := st.Offset + 1
	if starts, err := s.adm.ListStartOffsets(ctx, topic); err == nil {
		if o, ok := starts.Lookup(topic, start.Partition); ok && o.Err == nil && o.Offset > from {
			if !fresh {
				s.cfg.Logger.Warn("progress markers after the saved state have expired from the progress topic; events they name may be published again",
					"progress_topic", topic, "saved_offset", st.Offset, "log_start", o.Offset)
			}
			from = o.Offset
		}
	}

	found, err := s.readMarkers(ctx, start.Partition, from, start.Offset, st)
	if err != nil {
		return nil, err
	}
	if found > 0 {
		st.PendingAge = 0
		s.cfg.Logger.Info("Kafka holds committed events the outbox has not acknowledged; they are skipped when re-delivered",
			"events", found, "transactional_id", id)
	}
	st.Partition, st.Offset = start.Partition, start.Offset
	return st, nil
}

// readMarkers reads, read_committed, the progress partition from offset
// from up to and including the start record at end, adding the digests of
// this id's markers to st.
func (s *Sink) readMarkers(ctx context.Context, partition int32, from, end int64, st *txnState) (int, error) {
	opts, err := s.cfg.clientOpts()
	if err != nil {
		return 0, err
	}
	opts = append(opts,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{s.cfg.ProgressTopic: {partition: kgo.NewOffset().At(from)}}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	)
	rd, err := kgo.NewClient(opts...)
	if err != nil {
		return 0, fmt.Errorf("kafka sink: %w", err)
	}
	defer rd.Close()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	found := 0
	for {
		fs := rd.PollFetches(ctx)
		if ctx.Err() != nil {
			return 0, fmt.Errorf("kafka sink: reading the progress topic %s up to offset %d: %w", s.cfg.ProgressTopic, end, context.Cause(ctx))
		}
		var fetchErr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !kerr.IsRetriable(err) {
				fetchErr = err
			}
		})
		if fetchErr != nil {
			return 0, fmt.Errorf("kafka sink: reading the progress topic %s: %w", s.cfg.ProgressTopic, fetchErr)
		}
		done := false
		var bad error
		fs.EachRecord(func(r *kgo.Record) {
			if r.Offset >= end {
				done = true
			}
			if r.Offset > end || string(r.Key) != s.cfg.TransactionalID {
				return
			}
			_, ds, ok, err := decodeMarker(r.Value)
			if err != nil {
				bad = fmt.Errorf("kafka sink: progress record at %s/%d offset %s: %w",
					r.Topic, r.Partition, strconv.FormatInt(r.Offset, 10), err)
			}
			if !ok {
				return
			}
			for _, d := range ds {
				st.pending[d] = struct{}{}
			}
			found += len(ds)
		})
		if bad != nil {
			return 0, bad
		}
		if done {
			return found, nil
		}
	}
}

// ensureProgressTopic creates the progress topic when it is missing.
func (s *Sink) ensureProgressTopic(ctx context.Context) error {
	topic := s.cfg.ProgressTopic
	details, err := s.adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("kafka sink: reading metadata of the progress topic %s: %w", topic, err)
	}
	if d, ok := details[topic]; ok && d.Err == nil {
		return nil
	} else if ok && !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return fmt.Errorf("kafka sink: progress topic %s: %w", topic, d.Err)
	}
	week := strconv.Itoa(7 * 24 * 3600 * 1000)
	deletePolicy := "delete"
	resp, err := s.adm.CreateTopics(ctx, 1, s.cfg.ReplicationFactor,
		map[string]*string{"retention.ms": &week, "cleanup.policy": &deletePolicy}, topic)
	if err != nil {
		return fmt.Errorf("kafka sink: creating the progress topic %s: %w", topic, err)
	}
	if r := resp[topic]; r.Err != nil && !errors.Is(r.Err, kerr.TopicAlreadyExists) {
		return fmt.Errorf("kafka sink: creating the progress topic %s: %w %s", topic, r.Err, r.ErrMessage)
	}
	s.cfg.Logger.Info("created the progress topic", "topic", topic)
	return nil
}

// publishTxn publishes msgs in one transaction together with a marker
// naming them, skipping those an earlier transaction already committed.
func (s *Sink) publishTxn(ctx context.Context, cl *kgo.Client, msgs []relay.Message, res relay.PublishResult) (relay.PublishResult, error) {
	s.mu.Lock()
	cur := s.txn
	s.mu.Unlock()
	if cur == nil {
		return relay.PublishResult{}, errors.New("kafka sink: not started")
	}
	st := cur.clone()
	digests := make([]digest, len(msgs))
	var todo []int
	skipped := 0
	for i, m := range msgs {
		d := digestOf(m)
		if _, ok := st.pending[d]; ok {
			delete(st.pending, d)
			skipped++
			continue
		}
		digests[i] = d
		todo = append(todo, i)
	}
	if skipped > 0 {
		s.cfg.Logger.Info("skipped re-delivered events Kafka already committed", "events", skipped, "still_expected", len(st.pending))
	}
	if len(st.pending) > 0 {
		st.PendingAge += int64(len(msgs))
		if st.PendingAge > pendingHorizon {
			s.cfg.Logger.Warn("stopped waiting for committed events to be re-delivered; should they come, they are published again",
				"events", len(st.pending), "after_messages", st.PendingAge)
			clear(st.pending)
			st.PendingAge = 0
		}
	}

	todo, err := s.admit(ctx, msgs, todo, res.Failed)
	if err != nil {
		return relay.PublishResult{}, err
	}
	res.Placements = s.newPlacements(len(msgs))
	// Each round either commits, or refuses at least one more topic and
	// tries again without it.
	for len(todo) > 0 {
		if err := cl.BeginTransaction(); err != nil {
			return relay.PublishResult{}, s.breakWith(fmt.Errorf("kafka sink: beginning a transaction: %w", err))
		}
		ds := make([]digest, len(todo))
		for j, i := range todo {
			ds[j] = digests[i]
		}
		marker := &kgo.Record{Topic: s.cfg.ProgressTopic, Key: []byte(s.cfg.TransactionalID), Value: encodeMarker(st.Seq+1, ds)}
		errs, err := s.produce(ctx, cl, msgs, todo, marker, res.Placements)
		if err != nil {
			// The transaction stays open; the next Start's fencing
			// aborts it.
			return relay.PublishResult{}, s.breakWith(err)
		}
		if firstErr(errs) == nil {
			if err := s.dialer.check(); err != nil {
				// Deposed between the acknowledgements and the commit:
				// the transaction stays open and the next leader's
				// fencing aborts it.
				return relay.PublishResult{}, s.breakWith(fmt.Errorf("kafka sink: not committing a transaction of %d events: %w", len(todo), err))
			}
			if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
				// Maybe committed, maybe not: the next Start reads the
				// markers and knows.
				return relay.PublishResult{}, s.breakWith(fmt.Errorf("kafka sink: committing a transaction of %d events: %w", len(todo), err))
			}
			st.Seq++
			st.Partition, st.Offset = marker.Partition, marker.Offset
			break
		}
		if err := cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
			return relay.PublishResult{}, s.breakWith(fmt.Errorf("kafka sink: aborting a transaction: %w", err))
		}
		// Refused topics leave the transaction; any other error (which
		// may only echo a refusal in the same transaction) is retried
		// with the rest, and fails the Publish when no refusal explains
		// it.
		kept := todo[:0:0]
		refused := 0
		for j, i := range todo {
			if e := errs[j]; e != nil && isTopicRefusal(e) {
				res.Failed[i] = fmt.Errorf("kafka sink: topic %s: %w", msgs[i].Topic, e)
				s.refuseTopic(msgs[i].Topic, res.Failed[i])
				refused++
				continue
			}
			kept = append(kept, i)
		}
		if refused == 0 {
			markerErr := errs[len(todo)]
			if err := s.classify(msgs, todo, errs[:len(todo)], res.Failed); err != nil {
				return relay.PublishResult{}, err
			}
			return relay.PublishResult{}, fmt.Errorf("kafka sink: the progress marker was refused: %w", markerErr)
		}
		todo = kept
	}
	s.mu.Lock()
	s.txn = st
	s.mu.Unlock()
	res.State = st.encode()
	return res, nil
}

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
