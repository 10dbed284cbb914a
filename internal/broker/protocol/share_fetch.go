package protocol

import (
	"context"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/outboxrelay/relay/internal/broker"
)

// shareSession is a member's share session (KIP-932): the partitions its
// fetches cover, and the epoch its next request must carry.
type shareSession struct {
	epoch int32
	parts map[topicPart]bool
}

// shareFetchDefaultRecords bounds a fetch that does not say how many
// records it takes (MaxRecords 0).
const shareFetchDefaultRecords = 500

// topicNames maps the topic ids of the broker's topics to their names.
func (s *Server) topicNames() map[[16]byte]string {
	out := map[[16]byte]string{}
	for _, ti := range s.b.Topics() {
		out[topicID(ti.Name)] = ti.Name
	}
	return out
}

// session resolves a request's share session by its epoch: 0 opens a new
// one (closing any), -1 closes it after this request, any other must be
// the session's next epoch. It returns the session (nil when closing) and
// an error code.
func (g *shareGroup) session(member string, epoch int32) (*shareSession, int16) {
	ss := g.sessions[member]
	switch {
	case epoch == 0:
		ss = &shareSession{epoch: 1, parts: map[topicPart]bool{}}
		g.sessions[member] = ss
		return ss, 0
	case epoch == -1:
		if ss == nil {
			return nil, kerr.ShareSessionNotFound.Code
		}
		delete(g.sessions, member)
		return nil, 0
	case ss == nil:
		return nil, kerr.ShareSessionNotFound.Code
	case epoch != ss.epoch:
		return nil, kerr.InvalidShareSessionEpoch.Code
	}
	ss.epoch++
	if ss.epoch < 0 {
		ss.epoch = 1
	}
	return ss, 0
}

// partition returns g's share partition of tp, initialized at the log's
// start (share.auto.offset.reset=earliest) or end when new. g.mu held.
func (s *Server) sharePartition(g *shareGroup, tp topicPart) (*sharePartition, error) {
	earliest, latest, err := s.b.Offsets(tp.topic, tp.partition)
	if err != nil {
		return nil, err
	}
	sp := g.parts[tp]
	if sp == nil {
		at := latest
		if g.cfg.Earliest {
			at = earliest
		}
		sp = &sharePartition{start: at, end: at, recs: map[int64]*shareRec{}}
		g.parts[tp] = sp
	}
	sp.clamp(earliest)
	return sp, nil
}

// acknowledge applies one partition's acknowledgements for member and
// returns the partition's error code. g.mu held.
func (s *Server) acknowledge(g *shareGroup, member string, tp topicPart, batches []ackBatch, now time.Time) int16 {
	sp, err := s.sharePartition(g, tp)
	if err != nil {
		return broker.KafkaErrorCode(err)
	}
	if !sp.validate(member, batches) {
		return kerr.InvalidRecordState.Code
	}
	if sp.apply(member, batches, g.cfg.limit(), now.Add(g.cfg.lock())) {
		g.signal()
	}
	return 0
}

// handleShareFetch applies the request's acknowledgements, then acquires
// records for the member from its session's partitions: records released
// or whose lock timed out first, then new ones, up to MaxRecords. With
// nothing to acquire it long-polls until the log grows, records become
// available again, a lock times out or MaxWaitMillis passes.
func (s *Server) handleShareFetch(ctx context.Context, c *conn, req *kmsg.ShareFetchRequest, resp *kmsg.ShareFetchResponse) {
	fail := func(code int16, msg string) {
		resp.ErrorCode = code
		if msg != "" {
			resp.ErrorMessage = &msg
		}
	}
	if req.GroupID == nil || *req.GroupID == "" || req.MemberID == nil || *req.MemberID == "" {
		fail(kerr.InvalidRequest.Code, "GroupId and MemberId are required")
		return
	}
	g := s.share.group(*req.GroupID, false)
	if g == nil {
		fail(kerr.ShareSessionNotFound.Code, "")
		return
	}
	member := *req.MemberID
	names := s.topicNames()
	now := time.Now()
	g.mu.Lock()
	resp.AcquisitionLockTimeoutMillis = int32(g.cfg.lock().Milliseconds())
	if req.IsRenewAck && (req.MaxWaitMillis != 0 || req.MinBytes != 0 || req.MaxBytes != 0 || req.MaxRecords != 0) {
		// Renewals may not be combined with fetching (KIP-1222): a
		// ShareFetch with IsRenewAck has its fetch parameters zero.
		g.mu.Unlock()
		fail(kerr.InvalidRequest.Code, "a ShareFetch with IsRenewAck must have MaxWaitMs, MinBytes, MaxBytes and MaxRecords zero")
		return
	}
	ss, code := g.session(member, req.ShareSessionEpoch)
	if code != 0 {
		g.mu.Unlock()
		fail(code, "")
		return
	}
	type slot struct{ t, p int }
	index := map[topicPart]slot{}
	out := func(tp topicPart, id [16]byte) *kmsg.ShareFetchResponseTopicPartition {
		if at, ok := index[tp]; ok {
			return &resp.Topics[at.t].Partitions[at.p]
		}
		ti := -1
		for i := range resp.Topics {
			if resp.Topics[i].TopicID == id {
				ti = i
			}
		}
		if ti < 0 {
			rt := kmsg.NewShareFetchResponseTopic()
			rt.TopicID = id
			resp.Topics = append(resp.Topics, rt)
			ti = len(resp.Topics) - 1
		}
		p := kmsg.NewShareFetchResponseTopicPartition()
		p.Partition = tp.partition
		p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = nodeID, 0
		resp.Topics[ti].Partitions = append(resp.Topics[ti].Partitions, p)
		index[tp] = slot{ti, len(resp.Topics[ti].Partitions) - 1}
		return &resp.Topics[ti].Partitions[len(resp.Topics[ti].Partitions)-1]
	}
	changed := false
	for _, rt := range req.Topics {
		name, known := names[rt.TopicID]
		for _, rp := range rt.Partitions {
			tp := topicPart{topic: name, partition: rp.Partition}
			if !known || !s.canTopic(c, kmsg.ACLOperationRead, name) {
				p := out(tp, rt.TopicID)
				p.ErrorCode = kerr.UnknownTopicID.Code
				if known {
					p.ErrorCode = kerr.TopicAuthorizationFailed.Code
				}
				continue
			}
			if ss != nil && !req.IsRenewAck {
				ss.parts[tp] = true
			}
			if len(rp.AcknowledgementBatches) > 0 {
				batches := make([]ackBatch, 0, len(rp.AcknowledgementBatches))
				for _, b := range rp.AcknowledgementBatches {
					batches = append(batches, ackBatch{b.FirstOffset, b.LastOffset, b.AcknowledgeTypes})
				}
				p := out(tp, rt.TopicID)
				p.AcknowledgeErrorCode = s.acknowledge(g, member, tp, batches, now)
				changed = changed || p.AcknowledgeErrorCode == 0
			}
		}
	}
	if ss != nil {
		for _, ft := range req.ForgottenTopicsData {
			for _, p := range ft.Partitions {
				delete(ss.parts, topicPart{topic: names[ft.TopicID], partition: p})
			}
		}
	} else if g.releaseMember(member, now) {
		changed = true
	}
	if changed {
		s.share.persist(g)
	}
	if ss == nil || req.IsRenewAck {
		g.mu.Unlock()
		return
	}
	maxRecords := int(req.MaxRecords)
	if maxRecords <= 0 {
		maxRecords = shareFetchDefaultRecords
	}
	var deadline time.Time
	if req.MaxWaitMillis > 0 {
		deadline = now.Add(time.Duration(req.MaxWaitMillis) * time.Millisecond)
	}
	for {
		acquired, wait := s.shareAcquire(ctx, g, member, ss, int(req.MaxBytes), maxRecords, out)
		if acquired > 0 || deadline.IsZero() || ctx.Err() != nil {
			g.mu.Unlock()
			return
		}
		wake := g.wake
		var watches []<-chan struct{}
		for tp := range ss.parts {
			if ch, err := s.b.Watch(tp.topic, tp.partition); err == nil {
				watches = append(watches, ch)
			}
		}
		g.mu.Unlock()
		until := time.Until(deadline)
		if !wait.IsZero() {
			until = min(until, time.Until(wait))
		}
		if until <= 0 && time.Now().After(deadline) {
			return
		}
		waitAny(ctx, append(watches, wake), max(until, time.Millisecond))
		g.mu.Lock()
		if g.sessions[member] != ss {
			g.mu.Unlock()
			return
		}
	}
}

// shareAcquire acquires records for member across its session's
// partitions and adds them to the response; it returns how many, and the
// earliest lock deadline still pending (for the long poll). g.mu held.
func (s *Server) shareAcquire(ctx context.Context, g *shareGroup, member string, ss *shareSession, maxBytes, maxRecords int, out func(topicPart, [16]byte) *kmsg.ShareFetchResponseTopicPartition) (int, time.Time) {
	now := time.Now()
	lockUntil := now.Add(g.cfg.lock())
	if maxBytes <= 0 {
		maxBytes = 50 << 20
	}
	total := 0
	var nextLock time.Time
	for tp := range ss.parts {
		if total >= maxRecords || maxBytes <= 0 {
			break
		}
		sp, err := s.sharePartition(g, tp)
		if err != nil {
			out(tp, topicID(tp.topic)).ErrorCode = broker.KafkaErrorCode(err)
			continue
		}
		if sp.expire(now, g.cfg.limit()) {
			s.share.persist(g)
		}
		room := min(maxRecords-total, g.cfg.maxLocks()-sp.locked())
		var acq acquisition
		seen := map[int64]bool{}
		for pass := 0; pass < 2 && room > 0; pass++ {
			from := sp.firstAvailable()
			if pass == 1 {
				if from == sp.end {
					break // the first pass already read from end
				}
				from = sp.end
			}
			_, hwm, err := s.b.Offsets(tp.topic, tp.partition)
			if err != nil || from >= hwm {
				continue
			}
			res, err := s.b.FetchInto(ctx, tp.topic, tp.partition, from, max(maxBytes, 1), nil)
			if err != nil && len(res.Batches) == 0 {
				continue
			}
			before := len(acq.offsets)
			sp.acquire(res.Batches, member, room, lockUntil, seen, &acq)
			room -= len(acq.offsets) - before
		}
		if d := sp.nextDeadline(); !d.IsZero() && (nextLock.IsZero() || d.Before(nextLock)) {
			nextLock = d
		}
		if len(acq.offsets) == 0 {
			continue
		}
		p := out(tp, topicID(tp.topic))
		p.Records = acq.batches
		p.AcquiredRecords = acquiredRanges(acq)
		total += len(acq.offsets)
		maxBytes -= len(acq.batches)
	}
	return total, nextLock
}

// acquiredRanges folds acquired offsets into ranges of consecutive offsets
// with one delivery count.
func acquiredRanges(acq acquisition) []kmsg.ShareFetchResponseTopicPartitionAcquiredRecord {
	var out []kmsg.ShareFetchResponseTopicPartitionAcquiredRecord
	for i, o := range acq.offsets {
		if n := len(out); n > 0 && out[n-1].LastOffset == o-1 && out[n-1].DeliveryCount == acq.counts[i] {
			out[n-1].LastOffset = o
			continue
		}
		r := kmsg.NewShareFetchResponseTopicPartitionAcquiredRecord()
		r.FirstOffset, r.LastOffset, r.DeliveryCount = o, o, acq.counts[i]
		out = append(out, r)
	}
	return out
}

// handleShareAcknowledge applies acknowledgements outside a fetch; epoch
// -1 also closes the member's share session, releasing what it still
// holds.
func (s *Server) handleShareAcknowledge(c *conn, req *kmsg.ShareAcknowledgeRequest, resp *kmsg.ShareAcknowledgeResponse) {
	fail := func(code int16, msg string) {
		resp.ErrorCode = code
		if msg != "" {
			resp.ErrorMessage = &msg
		}
	}
	if req.GroupID == nil || *req.GroupID == "" || req.MemberID == nil || *req.MemberID == "" {
		fail(kerr.InvalidRequest.Code, "GroupId and MemberId are required")
		return
	}
	if req.ShareSessionEpoch == 0 {
		fail(kerr.InvalidShareSessionEpoch.Code, "ShareAcknowledge cannot open a share session")
		return
	}
	g := s.share.group(*req.GroupID, false)
	if g == nil {
		fail(kerr.ShareSessionNotFound.Code, "")
		return
	}
	member := *req.MemberID
	names := s.topicNames()
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	resp.AcquisitionLockTimeoutMillis = int32(g.cfg.lock().Milliseconds())
	ss, code := g.session(member, req.ShareSessionEpoch)
	if code != 0 {
		fail(code, "")
		return
	}
	changed := false
	for _, rt := range req.Topics {
		t := kmsg.NewShareAcknowledgeResponseTopic()
		t.TopicID = rt.TopicID
		name, known := names[rt.TopicID]
		for _, rp := range rt.Partitions {
			p := kmsg.NewShareAcknowledgeResponseTopicPartition()
			p.Partition = rp.Partition
			p.CurrentLeader.LeaderID, p.CurrentLeader.LeaderEpoch = nodeID, 0
			switch {
			case !known:
				p.ErrorCode = kerr.UnknownTopicID.Code
			case !s.canTopic(c, kmsg.ACLOperationRead, name):
				p.ErrorCode = kerr.TopicAuthorizationFailed.Code
			default:
				batches := make([]ackBatch, 0, len(rp.AcknowledgementBatches))
				for _, b := range rp.AcknowledgementBatches {
					batches = append(batches, ackBatch{b.FirstOffset, b.LastOffset, b.AcknowledgeTypes})
				}
				p.ErrorCode = s.acknowledge(g, member, topicPart{topic: name, partition: rp.Partition}, batches, now)
				changed = changed || p.ErrorCode == 0
			}
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	if ss == nil && g.releaseMember(member, now) {
		changed = true
	}
	if changed {
		s.share.persist(g)
	}
}
