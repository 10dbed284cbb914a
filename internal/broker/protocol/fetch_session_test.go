package protocol

import (
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func sessionFetch(id, epoch int32, topic string, parts map[int32]int64, forget ...int32) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.Version, req.MaxBytes, req.SessionID, req.SessionEpoch = 12, 1<<20, id, epoch
	if len(parts) > 0 {
		rt := kmsg.NewFetchRequestTopic()
		rt.Topic = topic
		for _, p := range slices.Sorted(func(yield func(int32) bool) {
			for p := range parts {
				if !yield(p) {
					return
				}
			}
		}) {
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p, parts[p], 1<<20
			rt.Partitions = append(rt.Partitions, rp)
		}
		req.Topics = append(req.Topics, rt)
	}
	if len(forget) > 0 {
		ft := kmsg.NewFetchRequestForgottenTopic()
		ft.Topic, ft.Partitions = topic, forget
		req.ForgottenTopics = append(req.ForgottenTopics, ft)
	}
	return req
}

// answered is the partitions a fetch response lists.
func answered(resp *kmsg.FetchResponse) []int32 {
	var ps []int32
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			ps = append(ps, p.Partition)
		}
	}
	slices.Sort(ps)
	return ps
}

// TestFetchSessions: a full fetch with epoch 0 opens a session; an
// incremental fetch names no partitions and is answered only with those
// that changed; forgotten partitions leave the session; a wrong epoch or
// an unknown id is refused with Kafka's error codes; epoch -1 closes it.
// franz-go opens a session when offered one.
func TestFetchSessions(t *testing.T) {
	t.Parallel()
	const topic = "sessions"
	f, ctx := setupTopic(t, topic, 3, 30*time.Second)
	prod := newKgo(t, f.addr, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	defer prod.Close()
	produceTo := func(p int32) {
		t.Helper()
		if err := prod.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produceTo(0)
	rc := dialRaw(t, f.addr)
	fetch := func(req *kmsg.FetchRequest) *kmsg.FetchResponse {
		t.Helper()
		return roundTrip[*kmsg.FetchResponse](t, rc, req)
	}

	full := fetch(sessionFetch(0, 0, topic, map[int32]int64{0: 0, 1: 0, 2: 0}))
	id := full.SessionID
	if full.ErrorCode != 0 || id == 0 || !slices.Equal(answered(full), []int32{0, 1, 2}) {
		t.Fatalf("full fetch: error %v session %d partitions %v", kerr.ErrorForCode(full.ErrorCode), id, answered(full))
	}
	if r := fetch(sessionFetch(id, 1, topic, map[int32]int64{0: 1})); r.ErrorCode != 0 || r.SessionID != id || len(answered(r)) != 0 {
		t.Fatalf("incremental fetch with nothing new: error %v session %d partitions %v", kerr.ErrorForCode(r.ErrorCode), r.SessionID, answered(r))
	}
	produceTo(1)
	r := fetch(sessionFetch(id, 2, topic, nil))
	if r.ErrorCode != 0 || !slices.Equal(answered(r), []int32{1}) || len(r.Topics[0].Partitions[0].RecordBatches) == 0 || r.Topics[0].Partitions[0].HighWatermark != 1 {
		t.Fatalf("incremental fetch after a produce to 1: %+v", r)
	}
	wantCode(t, "an epoch used before", fetch(sessionFetch(id, 2, topic, nil)).ErrorCode, kerr.InvalidFetchSessionEpoch)
	wantCode(t, "an unknown session", fetch(sessionFetch(id+1, 1, topic, nil)).ErrorCode, kerr.FetchSessionIDNotFound)
	// Forget 1 (the session still expects epoch 3: failed requests do not
	// advance it), then a produce to 1 is not answered, one to 2 is.
	if r := fetch(sessionFetch(id, 3, topic, map[int32]int64{1: 1}, 1)); r.ErrorCode != 0 || len(answered(r)) != 0 {
		t.Fatalf("forgetting: error %v partitions %v", kerr.ErrorForCode(r.ErrorCode), answered(r))
	}
	produceTo(1)
	produceTo(2)
	if r := fetch(sessionFetch(id, 4, topic, nil)); !slices.Equal(answered(r), []int32{2}) {
		t.Fatalf("after forgetting 1: partitions %v, want [2]", answered(r))
	}
	// Epoch -1 closes the session and is a full sessionless fetch.
	if r := fetch(sessionFetch(id, -1, topic, map[int32]int64{0: 1})); r.ErrorCode != 0 || r.SessionID != 0 || !slices.Equal(answered(r), []int32{0}) {
		t.Fatalf("closing fetch: error %v session %d partitions %v", kerr.ErrorForCode(r.ErrorCode), r.SessionID, answered(r))
	}
	wantCode(t, "a closed session", fetch(sessionFetch(id, 5, topic, nil)).ErrorCode, kerr.FetchSessionIDNotFound)

	// franz-go uses a session when offered one, and keeps consuming.
	before := f.srv.fetchSessions.len()
	cons := newKgo(t, f.addr, kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	defer cons.Close()
	got := 0
	for got < 4 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consumed %d of 4", got)
		}
		got += fs.NumRecords()
	}
	produceTo(2)
	for got < 5 {
		got += cons.PollFetches(ctx).NumRecords()
		if ctx.Err() != nil {
			t.Fatal("the record produced after the session opened was not consumed")
		}
	}
	if n := f.srv.fetchSessions.len(); n <= before {
		t.Fatalf("fetch sessions: %d, before the consumer %d: franz-go opened none", n, before)
	}
}

// TestFetchSessionEviction: with the cache full, a new session evicts the
// least recently used idle one, else the one with the fewest partitions
// if it has fewer than the new one, else gets no session.
func TestFetchSessionEviction(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	c := newFetchSessionCache(2)
	c.now = func() time.Time { return now }
	open := func(parts int) int32 {
		t.Helper()
		ps := map[int32]int64{}
		for p := range int32(parts) {
			ps[p] = 0
		}
		req := sessionFetch(0, 0, "t", ps)
		fc, code := c.begin(req)
		if code != 0 {
			t.Fatalf("begin: %v", kerr.ErrorForCode(code))
		}
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		fc.finish(resp)
		return resp.SessionID
	}
	alive := func(id int32) bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.sessions[id] != nil
	}
	small, big := open(1), open(3)
	now = now.Add(time.Second)
	if mid := open(2); mid == 0 || alive(small) || !alive(big) {
		t.Fatalf("a 2-partition session: got %d, small alive %v, big alive %v: want the 1-partition one evicted", mid, alive(small), alive(big))
	}
	if tiny := open(1); tiny != 0 {
		t.Fatalf("a 1-partition session with every kept one larger and busy got session %d, want none", tiny)
	}
	// Two minutes later the 3-partition session was used, the other not:
	// the idle one goes, whatever its size.
	now = now.Add(fetchSessionEviction)
	c.mu.Lock()
	c.sessions[big].lastUsed = now
	c.mu.Unlock()
	if tiny := open(1); tiny == 0 || !alive(big) {
		t.Fatalf("with an idle session: got %d, big alive %v", tiny, alive(big))
	}
	off := newFetchSessionCache(0)
	req := sessionFetch(0, 0, "t", map[int32]int64{0: 0})
	fc, _ := off.begin(req)
	resp := req.ResponseKind().(*kmsg.FetchResponse)
	if fc.finish(resp); resp.SessionID != 0 {
		t.Fatalf("a cache without slots opened session %d", resp.SessionID)
	}
}
