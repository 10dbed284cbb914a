package protocol

import (
	"crypto/rand"
	"encoding/binary"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Fetch sessions (KIP-227, incremental fetch), as Kafka keeps them. A Fetch
// (v7+) with session id 0 and epoch 0 is a full fetch that opens a
// session: the response names its id, and the partitions of the request
// are the session's. The client then sends the session id with epochs 1,
// 2, ...: each such incremental request lists only the partitions it adds
// or whose fetch offset or max bytes changed, and the ones it forgets;
// the server fetches every partition of the session from the offsets it
// keeps, and answers only the partitions that have records, an error, or
// a high watermark, last stable offset or log start offset that changed
// since the session last answered them. An idle consumer of many
// partitions thus sends and receives a few dozen bytes per fetch instead
// of every partition. Epoch -1 is a sessionless full fetch, closing the
// session named if any (a full fetch with a session id closes it too).
//
// Errors: an unknown (or evicted) session id gets
// FETCH_SESSION_ID_NOT_FOUND, an epoch other than the one expected
// INVALID_FETCH_SESSION_EPOCH (one of two concurrent requests on a
// session therefore fails); clients then start a new session with a full
// fetch. The cache holds Config.FetchSessionCacheSlots sessions (Kafka's
// max.incremental.fetch.session.cache.slots, default 1000). When full, a
// new session evicts the least recently used session idle for
// fetchSessionEviction (Kafka's min.incremental.fetch.session.eviction.ms,
// 120 s), or else the session with the fewest partitions (the oldest id
// among equals) if it has fewer than the new one; otherwise the new full
// fetch is answered without a session (id 0), and the client goes on with
// full fetches. There are no followers, so no session is privileged.
// Sessions are in memory only: after a restart clients get
// FETCH_SESSION_ID_NOT_FOUND once and open a new one. A session changes
// what a fetch lists, never what it reads: every fetch still reads each
// partition of the session from the offset the client last sent, so a
// lost response or a dropped session costs a full fetch, not a record
// (TestFetchSessions, TestFetchSessionEviction).

const fetchSessionEviction = 120 * time.Second

type fetchSessionCache struct {
	slots int
	now   func() time.Time

	mu       sync.Mutex
	sessions map[int32]*fetchSession
}

type fetchSession struct {
	id       int32
	epoch    int32 // the epoch the next incremental request must carry
	lastUsed time.Time
	// parts, in the order they were added, and their state.
	order []topicPart
	parts map[topicPart]*sessionPart
}

type sessionPart struct {
	req kmsg.FetchRequestTopicPartition
	// What the session last answered for the partition; sent is false
	// until it was answered once.
	sent                   bool
	hw, lso, logStart      int64
	topicIDForOlderClients [16]byte
}

func newFetchSessionCache(slots int) *fetchSessionCache {
	return &fetchSessionCache{slots: slots, now: time.Now, sessions: map[int32]*fetchSession{}}
}

// fetchContext is one fetch's view of its session: the request to serve
// (every partition of the session) and what to do with the response.
type fetchContext struct {
	c       *fetchSessionCache
	req     *kmsg.FetchRequest
	session *fetchSession // incremental: the session served
	create  bool          // full fetch with epoch 0: open a session
}

// begin resolves req against the cache: it returns the fetch context, or
// an error code for the whole request.
func (c *fetchSessionCache) begin(req *kmsg.FetchRequest) (*fetchContext, int16) {
	full := req.SessionEpoch == 0 || req.SessionEpoch == -1
	if c == nil || req.Version < 7 {
		if req.SessionID != 0 || !full {
			if req.SessionID != 0 {
				return nil, kerr.FetchSessionIDNotFound.Code
			}
			return nil, kerr.InvalidFetchSessionEpoch.Code
		}
		return &fetchContext{req: req}, 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if full {
		if req.SessionID != 0 {
			delete(c.sessions, req.SessionID)
		}
		return &fetchContext{c: c, req: req, create: req.SessionEpoch == 0}, 0
	}
	fs := c.sessions[req.SessionID]
	if fs == nil {
		return nil, kerr.FetchSessionIDNotFound.Code
	}
	if fs.epoch != req.SessionEpoch {
		return nil, kerr.InvalidFetchSessionEpoch.Code
	}
	fs.epoch = nextSessionEpoch(fs.epoch)
	fs.lastUsed = c.now()
	// Added and changed partitions first, then the forgotten ones, as
	// Kafka applies them.
	for _, rt := range req.Topics {
		for _, rp := range rt.Partitions {
			fs.put(rt.Topic, rt.TopicID, rp)
		}
	}
	for _, ft := range req.ForgottenTopics {
		for _, p := range ft.Partitions {
			tp := topicPart{ft.Topic, p}
			if _, ok := fs.parts[tp]; ok {
				delete(fs.parts, tp)
				fs.order = slices.DeleteFunc(fs.order, func(x topicPart) bool { return x == tp })
			}
		}
	}
	work := *req
	work.Topics = fs.topics()
	work.ForgottenTopics = nil
	return &fetchContext{c: c, req: &work, session: fs}, 0
}

func nextSessionEpoch(e int32) int32 {
	if e == math.MaxInt32 {
		return 1
	}
	return e + 1
}

func (fs *fetchSession) put(topic string, id [16]byte, rp kmsg.FetchRequestTopicPartition) {
	tp := topicPart{topic, rp.Partition}
	sp := fs.parts[tp]
	if sp == nil {
		sp = &sessionPart{}
		fs.parts[tp] = sp
		fs.order = append(fs.order, tp)
	}
	sp.req, sp.topicIDForOlderClients = rp, id
}

// topics is the session's partitions as a full request lists them.
func (fs *fetchSession) topics() []kmsg.FetchRequestTopic {
	var out []kmsg.FetchRequestTopic
	for _, tp := range fs.order {
		sp := fs.parts[tp]
		if n := len(out); n == 0 || out[n-1].Topic != tp.topic {
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic, rt.TopicID = tp.topic, sp.topicIDForOlderClients
			out = append(out, rt)
		}
		out[len(out)-1].Partitions = append(out[len(out)-1].Partitions, sp.req)
	}
	return out
}

// finish completes resp: a full fetch with epoch 0 opens a session (if the
// cache has or can make room) and remembers what it answered; an
// incremental one drops the partitions with nothing new.
func (fc *fetchContext) finish(resp *kmsg.FetchResponse) {
	if fc.c == nil {
		return
	}
	fc.c.mu.Lock()
	defer fc.c.mu.Unlock()
	switch {
	case fc.create:
		fs := &fetchSession{epoch: 1, lastUsed: fc.c.now(), parts: map[topicPart]*sessionPart{}}
		for _, rt := range fc.req.Topics {
			for _, rp := range rt.Partitions {
				fs.put(rt.Topic, rt.TopicID, rp)
			}
		}
		if !fc.c.makeRoom(len(fs.parts)) {
			return
		}
		fs.id = fc.c.newID()
		fc.c.sessions[fs.id] = fs
		resp.SessionID = fs.id
		fs.update(resp, false)
	case fc.session != nil:
		if fc.c.sessions[fc.session.id] != fc.session {
			// Evicted meanwhile: answered in full, as the client's next
			// request will learn.
			resp.SessionID = fc.session.id
			return
		}
		resp.SessionID = fc.session.id
		fc.session.update(resp, true)
	}
}

// update records what resp answers for each partition and, when
// incremental, removes the partitions that have nothing new.
func (fs *fetchSession) update(resp *kmsg.FetchResponse, incremental bool) {
	topics := resp.Topics[:0]
	for _, t := range resp.Topics {
		parts := t.Partitions[:0]
		for _, p := range t.Partitions {
			sp := fs.parts[topicPart{t.Topic, p.Partition}]
			if sp == nil {
				parts = append(parts, p)
				continue
			}
			news := !sp.sent || p.ErrorCode != 0 || len(p.RecordBatches) > 0 ||
				p.HighWatermark != sp.hw || p.LastStableOffset != sp.lso || p.LogStartOffset != sp.logStart
			sp.sent, sp.hw, sp.lso, sp.logStart = true, p.HighWatermark, p.LastStableOffset, p.LogStartOffset
			if news || !incremental {
				parts = append(parts, p)
			}
		}
		if len(parts) > 0 || !incremental {
			t.Partitions = parts
			topics = append(topics, t)
		}
	}
	resp.Topics = topics
}

// makeRoom frees a slot for a new session of n partitions, by Kafka's
// eviction rules; false when the new session may not have one.
func (c *fetchSessionCache) makeRoom(n int) bool {
	if c.slots <= 0 {
		return false
	}
	if len(c.sessions) < c.slots {
		return true
	}
	now := c.now()
	var lru, smallest *fetchSession
	for _, fs := range c.sessions {
		if now.Sub(fs.lastUsed) >= fetchSessionEviction && (lru == nil || fs.lastUsed.Before(lru.lastUsed)) {
			lru = fs
		}
		if smallest == nil || len(fs.parts) < len(smallest.parts) || (len(fs.parts) == len(smallest.parts) && fs.id < smallest.id) {
			smallest = fs
		}
	}
	switch {
	case lru != nil:
		delete(c.sessions, lru.id)
	case smallest != nil && len(smallest.parts) < n:
		delete(c.sessions, smallest.id)
	default:
		return false
	}
	return true
}

// newID is a random unused positive session id.
func (c *fetchSessionCache) newID() int32 {
	for {
		var b [4]byte
		_, _ = rand.Read(b[:])
		id := int32(binary.BigEndian.Uint32(b[:]) & math.MaxInt32)
		if _, used := c.sessions[id]; id != 0 && !used {
			return id
		}
	}
}

// len is the number of sessions kept.
func (c *fetchSessionCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sessions)
}
