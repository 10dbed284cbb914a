package protocol

import (
	"context"
	"encoding/binary"
	"errors"
	"reflect"
	"sync"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// handleFetch resolves the topic ids of a v13+ request (fetchTopicIDs),
// the request's fetch session (fetch_session.go), checks the session's
// partitions against the ACLs (authorizeFetch) and serves them (fetchLog);
// an incremental response then keeps only the partitions with something
// new.
func (s *Server) handleFetch(ctx context.Context, c *conn, req *kmsg.FetchRequest) (kmsg.Response, func()) {
	unknown := s.fetchTopicIDs(req)
	fc, code := s.fetchSessions.begin(req)
	if code != 0 {
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		resp.ErrorCode, resp.SessionID = code, 0
		return resp, nil
	}
	work := fc.req
	if work == req {
		cp := *req
		work = &cp
	}
	fix := s.authorizeFetch(c, work)
	r, release := s.fetchLog(ctx, work)
	resp := r.(*kmsg.FetchResponse)
	if fix != nil {
		fix(resp)
	}
	fc.finish(resp)
	resp.Topics = append(resp.Topics, unknown...)
	return resp, release
}

// fetchLog serves stored record batches verbatim. It answers at once
// when MinBytes are available or any partition has an error; otherwise it
// long-polls, re-reading when a requested partition's high watermark moves,
// until MinBytes arrive or MaxWaitMillis passes. Each partition gets at
// most PartitionMaxBytes and the response at most MaxBytes, except that
// the first batch found is always returned whole so that a consumer can
// make progress past a batch larger than its limits. read_uncommitted reads up to the high watermark;
// read_committed (isolation level 1) up to the last stable offset, with
// the aborted transactions among the returned batches listed so the
// client skips their records (it also skips the control batches).
//
// The record batches are read into pooled buffers that the response
// aliases; release returns them once the response is written.
func (s *Server) fetchLog(ctx context.Context, req *kmsg.FetchRequest) (_ kmsg.Response, release func()) {
	resp := req.ResponseKind().(*kmsg.FetchResponse)
	var bufs readBuffers
	var deadline time.Time
	if req.MaxWaitMillis > 0 {
		deadline = time.Now().Add(time.Duration(req.MaxWaitMillis) * time.Millisecond)
	}
	// Under a budget, each fill reserves half of the fetch responses'
	// share (the response is cut to that) and keeps what the batches took
	// until the response is written; nothing is held while the fetch
	// long-polls. The first batch, always returned whole, may go past the
	// reserve by up to one batch. Responses have their own share so that
	// a connection's read-ahead requests, which hold the requests' share
	// until this one is handled, can never keep it from being answered.
	reserve := s.fetchBudget.fetchReserve()
	if reserve > 0 {
		if req.Version < 3 || req.MaxBytes <= 0 || int64(req.MaxBytes) > reserve {
			req.MaxBytes = int32(min(reserve, 1<<31-1))
		}
		for i := range req.Topics {
			for j := range req.Topics[i].Partitions {
				if p := &req.Topics[i].Partitions[j]; int64(p.PartitionMaxBytes) > reserve {
					p.PartitionMaxBytes = req.MaxBytes
				}
			}
		}
	}
	var held int64
	done := func() {
		bufs.release()
		s.fetchBudget.release(held)
		held = 0
	}
	for {
		watches := s.fetchWatches(req, deadline)
		done()
		if err := s.fetchBudget.acquire(ctx, reserve); err != nil {
			return resp, nil
		}
		held = reserve
		bytes, stop := s.fillFetch(ctx, req, resp, &bufs)
		if used := int64(bytes); used < held {
			s.fetchBudget.release(held - used)
			held = used
		}
		if stop || bytes >= int(req.MinBytes) || len(watches) == 0 || ctx.Err() != nil {
			return resp, done
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return resp, done
		}
		if !waitAny(ctx, watches, wait) {
			return resp, done
		}
	}
}

// fetchWatches collects the high watermark channels of the requested
// partitions before they are read, so a write in between still wakes the
// wait. None are needed when the request will not wait.
func (s *Server) fetchWatches(req *kmsg.FetchRequest, deadline time.Time) []<-chan struct{} {
	if deadline.IsZero() || req.MinBytes <= 0 {
		return nil
	}
	var chs []<-chan struct{}
	for _, rt := range req.Topics {
		for _, rp := range rt.Partitions {
			if isOffsetsTopic(rt.Topic) {
				chs = append(chs, s.offsets.watch())
				continue
			}
			if ch, err := s.b.Watch(rt.Topic, rp.Partition); err == nil {
				chs = append(chs, ch)
			}
		}
	}
	return chs
}

// fillFetch (re)builds resp from the log and returns the bytes of record
// batches in it, and whether a partition error calls for an answer now.
func (s *Server) fillFetch(ctx context.Context, req *kmsg.FetchRequest, resp *kmsg.FetchResponse, bufs *readBuffers) (int, bool) {
	remaining := int(req.MaxBytes)
	if req.Version < 3 || remaining <= 0 {
		remaining = int(^uint32(0) >> 1)
	}
	total, stop := 0, false
	resp.Topics = resp.Topics[:0]
	for _, rt := range req.Topics {
		t := kmsg.NewFetchResponseTopic()
		t.Topic, t.TopicID = rt.Topic, rt.TopicID
		t.Partitions = make([]kmsg.FetchResponseTopicPartition, 0, len(rt.Partitions))
		for _, rp := range rt.Partitions {
			p := kmsg.NewFetchResponseTopicPartition()
			p.Partition = rp.Partition
			p.HighWatermark, p.LastStableOffset, p.LogStartOffset = -1, -1, -1
			p.PreferredReadReplica = -1
			p.RecordBatches = []byte{}
			if rp.CurrentLeaderEpoch > 0 {
				p.ErrorCode = kerr.UnknownLeaderEpoch.Code
				stop = true
				t.Partitions = append(t.Partitions, p)
				continue
			}
			if isOffsetsTopic(rt.Topic) {
				s.offsets.fetch(rp, &p)
				stop = stop || p.ErrorCode != 0
				t.Partitions = append(t.Partitions, p)
				continue
			}
			limit := int(rp.PartitionMaxBytes)
			if total > 0 {
				limit = min(limit, remaining)
			}
			if limit <= 0 && total > 0 {
				earliest, latest, err := s.b.Offsets(rt.Topic, rp.Partition)
				if err == nil {
					p.HighWatermark, p.LastStableOffset, p.LogStartOffset = latest, latest, earliest
					if lso, err := s.b.LastStableOffset(rt.Topic, rp.Partition); err == nil {
						p.LastStableOffset = lso
					}
				} else {
					p.ErrorCode = broker.KafkaErrorCode(err)
				}
				t.Partitions = append(t.Partitions, p)
				continue
			}
			res, err := bufs.fetch(ctx, s.b, rt.Topic, rp.Partition, rp.FetchOffset, max(limit, 1), req.IsolationLevel == 1)
			p.HighWatermark, p.LastStableOffset, p.LogStartOffset = res.HighWatermark, res.LastStableOffset, res.LogStartOffset
			for _, a := range res.Aborted {
				at := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
				at.ProducerID, at.FirstOffset = a.ProducerID, a.FirstOffset
				p.AbortedTransactions = append(p.AbortedTransactions, at)
			}
			if err != nil {
				p.ErrorCode = broker.KafkaErrorCode(err)
				if errors.Is(err, broker.ErrDataLost) {
					p.ErrorCode = s.cfg.LostDataErrorCode
				}
				if p.ErrorCode != kerr.OffsetOutOfRange.Code {
					p.HighWatermark, p.LastStableOffset, p.LogStartOffset = -1, -1, -1
				}
				stop = true
			}
			// An empty record set, not a null one: librdkafka rejects
			// a null set as a malformed response.
			p.RecordBatches = res.Batches
			if p.RecordBatches == nil {
				p.RecordBatches = []byte{}
			}
			total += len(res.Batches)
			remaining -= len(res.Batches)
			t.Partitions = append(t.Partitions, p)
		}
		resp.Topics = append(resp.Topics, t)
	}
	return total, stop
}

// waitAny blocks until one of chs is closed (true), or wait passes or ctx
// ends (false).
func waitAny(ctx context.Context, chs []<-chan struct{}, wait time.Duration) bool {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	if len(chs) == 1 {
		select {
		case <-chs[0]:
			return true
		case <-timer.C:
		case <-ctx.Done():
		}
		return false
	}
	// One select over every channel (reflect.Select), not a goroutine per
	// channel: an idle consumer's long poll may watch a thousand
	// partitions, and starting and waking that many goroutines per fetch
	// was most of the broker's cost of serving it.
	cases := make([]reflect.SelectCase, 0, len(chs)+2)
	cases = append(cases,
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(timer.C)},
		reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())})
	for _, ch := range chs {
		cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)})
	}
	chosen, _, _ := reflect.Select(cases)
	return chosen >= 2
}

// appendFetchResponse encodes resp as its AppendTo would, except that the
// record batches are not copied: it returns the encoding as pieces of dst
// (by offset) interleaved with the partitions' RecordBatches, for one
// vectored write. ok is false for a response this encoder does not cover
// (aborted transactions, tagged fields, or versions this server does not
// offer); callers then use AppendTo.
func appendFetchResponse(dst []byte, resp *kmsg.FetchResponse) (out []byte, pieces []fetchPiece, ok bool) {
	v := resp.Version
	if v < 4 || v > 13 || len(resp.Brokers) > 0 || resp.UnknownTags.Len() > 0 {
		return dst, nil, false
	}
	flexible := v >= 12
	appendLen := func(dst []byte, n int) []byte {
		if flexible {
			return binary.AppendUvarint(dst, uint64(n)+1)
		}
		return binary.BigEndian.AppendUint32(dst, uint32(n))
	}
	start := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, uint32(resp.ThrottleMillis))
	if v >= 7 {
		dst = binary.BigEndian.AppendUint16(dst, uint16(resp.ErrorCode))
		dst = binary.BigEndian.AppendUint32(dst, uint32(resp.SessionID))
	}
	dst = appendLen(dst, len(resp.Topics))
	for i := range resp.Topics {
		t := &resp.Topics[i]
		if t.UnknownTags.Len() > 0 {
			return dst[:start], nil, false
		}
		switch {
		case v >= 13:
			dst = append(dst, t.TopicID[:]...)
		case flexible:
			dst = binary.AppendUvarint(dst, uint64(len(t.Topic))+1)
			dst = append(dst, t.Topic...)
		default:
			dst = binary.BigEndian.AppendUint16(dst, uint16(len(t.Topic)))
			dst = append(dst, t.Topic...)
		}
		dst = appendLen(dst, len(t.Partitions))
		for j := range t.Partitions {
			p := &t.Partitions[j]
			if p.AbortedTransactions != nil || p.UnknownTags.Len() > 0 ||
				p.DivergingEpoch.Epoch != -1 || p.DivergingEpoch.EndOffset != -1 || p.DivergingEpoch.UnknownTags.Len() > 0 ||
				p.CurrentLeader.LeaderID != -1 || p.CurrentLeader.LeaderEpoch != -1 || p.CurrentLeader.UnknownTags.Len() > 0 ||
				p.SnapshotID.EndOffset != -1 || p.SnapshotID.Epoch != -1 || p.SnapshotID.UnknownTags.Len() > 0 {
				return dst[:start], nil, false
			}
			dst = binary.BigEndian.AppendUint32(dst, uint32(p.Partition))
			dst = binary.BigEndian.AppendUint16(dst, uint16(p.ErrorCode))
			dst = binary.BigEndian.AppendUint64(dst, uint64(p.HighWatermark))
			dst = binary.BigEndian.AppendUint64(dst, uint64(p.LastStableOffset))
			if v >= 5 {
				dst = binary.BigEndian.AppendUint64(dst, uint64(p.LogStartOffset))
			}
			// Null aborted transactions.
			if flexible {
				dst = append(dst, 0)
			} else {
				dst = binary.BigEndian.AppendUint32(dst, 0xffffffff)
			}
			if v >= 11 {
				dst = binary.BigEndian.AppendUint32(dst, uint32(p.PreferredReadReplica))
			}
			switch {
			case p.RecordBatches == nil && flexible:
				dst = append(dst, 0)
			case p.RecordBatches == nil:
				dst = binary.BigEndian.AppendUint32(dst, 0xffffffff)
			default:
				dst = appendLen(dst, len(p.RecordBatches))
				if len(p.RecordBatches) > 0 {
					pieces = append(pieces, fetchPiece{end: len(dst), batches: p.RecordBatches})
				}
			}
			if flexible {
				dst = append(dst, 0) // no partition tags
			}
		}
		if flexible {
			dst = append(dst, 0) // no topic tags
		}
	}
	if flexible {
		dst = append(dst, 0) // no response tags
	}
	return dst, pieces, true
}

// fetchPiece says that batches follow the encoding up to offset end.
type fetchPiece struct {
	end     int
	batches []byte
}

// readBuffers are the pooled buffers one fetch response reads into.
type readBuffers []*[]byte

// readBufferPool holds *[]byte read buffers; one fits a partition's batches
// at the 1 MiB max bytes most clients ask for.
var readBufferPool = sync.Pool{New: func() any { b := make([]byte, 0, 1<<20); return &b }}

// maxPooledReadBuffer keeps a rare huge read from pinning memory.
const maxPooledReadBuffer = 8 << 20

// fetch reads one partition into a pooled buffer held until release.
func (rb *readBuffers) fetch(ctx context.Context, b *broker.Broker, topic string, part int32, offset int64, maxBytes int, committed bool) (broker.FetchResult, error) {
	buf := readBufferPool.Get().(*[]byte)
	fetch := b.FetchInto
	if committed {
		fetch = b.FetchCommittedInto
	}
	res, err := fetch(ctx, topic, part, offset, maxBytes, (*buf)[:0])
	if len(res.Batches) == 0 {
		readBufferPool.Put(buf)
		return res, err
	}
	if cap(res.Batches) > cap(*buf) {
		// Read into a new, bigger array: keep that one instead.
		*buf = res.Batches[:0]
	}
	*rb = append(*rb, buf)
	return res, err
}

// release returns the buffers to the pool; nothing may use them after.
func (rb *readBuffers) release() {
	for _, b := range *rb {
		if cap(*b) <= maxPooledReadBuffer {
			*b = (*b)[:0]
			readBufferPool.Put(b)
		}
	}
	*rb = (*rb)[:0]
}
