package relay

// End-to-end readiness: the leader's heartbeat.
//
// Every ReadyTimeout/6 the leader inserts a heartbeat row into the outbox
// table, as a service inserts an event: topic HeartbeatTopic (a name Kafka
// refuses, so no user topic is this one), no key, and as payload this
// process's random nonce and the heartbeat's number. It travels the whole
// path of an event, whichever the reader: the poller reads it in a tick,
// the WAL reader streams its INSERT; the publisher recognises it by topic
// and nonce and hands it on without a message (a row with that topic and
// any other payload is routed as any event, and so dead-lettered for its
// topic); the durability stage passes it only after every earlier batch is
// durable, and then asks the sink whether it still accepts messages
// (Sink.Ready: the embedded broker's health, a round trip to Kafka); the
// acknowledgement deletes its row in the transaction that saves the
// checkpoint. Only once that transaction committed does the heartbeat
// count: the age of the newest counted heartbeat (from when it was sent, on
// the monotonic clock) is relay_heartbeat_age_seconds, and /readyz fails,
// naming the age, when it exceeds ReadyTimeout. So a reader that stalls (a
// lock on its tables, a dead replication stream), a sink that hangs or
// refuses (a full disk, an unreachable Kafka) and an acknowledgement that
// cannot commit (a lock on the checkpoint or on outbox rows) each turn
// /readyz red within ReadyTimeout plus one interval, and green once one
// heartbeat got through again.
//
// A new leader counts from the start of its pipeline: ready while its first
// heartbeat is younger than ReadyTimeout. A standby is never ready: it
// publishes nothing (its /readyz names its role; /healthz says it is alive,
// and relay_leader which process leads). The heartbeat is not fenced and
// not deduplicated: a heartbeat row of an earlier process or leader is
// removed without counting. A row with the heartbeat topic whose payload
// is not a heartbeat's is routed as any event (and dead-lettered for its
// topic). Nothing of a heartbeat reaches the log or the archive. The
// heartbeat costs an INSERT (and, with the poller, a tick) per interval.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// HeartbeatTopic is the topic of the leader's heartbeat rows. It is not a
// valid Kafka topic name, so it is never a user's.
const HeartbeatTopic = "relay heartbeat"

// heartbeats tracks the heartbeats this process sent and the newest that
// reached the log.
type heartbeats struct {
	nonce string

	mu   sync.Mutex
	next uint64
	sent map[uint64]time.Time
	// through is when the newest heartbeat that reached the log was sent
	// (or the pipeline started, before the first).
	through time.Time
}

func newHeartbeats() *heartbeats {
	b := make([]byte, 16)
	rand.Read(b)
	return &heartbeats{nonce: hex.EncodeToString(b), sent: map[uint64]time.Time{}}
}

// lead counts from now: the process just became the leader.
func (h *heartbeats) lead() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.through = time.Now()
}

func (h *heartbeats) send() (uint64, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	h.sent[h.next] = time.Now()
	return h.next, h.nonce + "/" + strconv.FormatUint(h.next, 10)
}

// of tells whether e is a heartbeat row, and returns its number when it is
// one of this process's and not yet counted (0 for a heartbeat of an
// earlier process or leader, which is just removed).
func (h *heartbeats) of(e Event) (uint64, bool) {
	if e.Topic != HeartbeatTopic || e.Key != nil {
		return 0, false
	}
	nonce, n, ok := strings.Cut(string(e.Payload), "/")
	seq, err := strconv.ParseUint(n, 10, 64)
	if raw, herr := hex.DecodeString(nonce); !ok || err != nil || herr != nil || len(raw) != 16 {
		return 0, false
	}
	if nonce != h.nonce {
		return 0, true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.sent[seq]; !ok {
		return 0, true
	}
	return seq, true
}

// reached records that heartbeat seq (and every earlier one) reached the
// log.
func (h *heartbeats) reached(seq uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	at, ok := h.sent[seq]
	if !ok {
		return
	}
	if at.After(h.through) {
		h.through = at
	}
	for s := range h.sent {
		if s <= seq {
			delete(h.sent, s)
		}
	}
}

// age is how long ago the newest heartbeat that reached the log was sent.
func (h *heartbeats) age() time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Since(h.through)
}

// Ready returns nil when the relay is the leader, its pipeline runs, the
// sink accepts messages and a heartbeat went through the whole path within
// ReadyTimeout (heartbeat.go).
func (r *Relay) Ready(ctx context.Context) error {
	if role := r.Role(); role != RoleLeader {
		return fmt.Errorf("role is %s", role)
	}
	if err := r.lastErr.Load(); err != nil {
		return *err
	}
	if err := r.waiting.err(); err != nil {
		return err
	}
	if err := r.sink.Ready(ctx); err != nil {
		return err
	}
	return r.heartbeatReady()
}

func (r *Relay) initHeartbeats() {
	r.beats = newHeartbeats()
	age := func() float64 {
		if r.Role() != RoleLeader || r.cfg.ReadyTimeout < 0 {
			return 0
		}
		return r.beats.age().Seconds()
	}
	r.m.heartbeatAge.Store(&age)
}

// heartbeatInterval is how often the leader sends a heartbeat.
func (c Config) heartbeatInterval() time.Duration {
	return min(max(c.ReadyTimeout/6, 50*time.Millisecond), 10*time.Second)
}

// sendHeartbeat is the heartbeat service's pass: it writes one heartbeat
// row (every heartbeatInterval, maintenance.go).
func (r *Relay) sendHeartbeat(ctx context.Context) error {
	_, payload := r.beats.send()
	return r.store.InsertHeartbeat(ctx, r.pool, HeartbeatTopic, []byte(payload))
}

// heartbeatReady fails when no heartbeat reached the log within
// ReadyTimeout.
func (r *Relay) heartbeatReady() error {
	if r.cfg.ReadyTimeout < 0 {
		return nil
	}
	if age := r.beats.age(); age > r.cfg.ReadyTimeout {
		return fmt.Errorf("no heartbeat reached the log for %v (bound %v): the reader, the sink or the acknowledgement is stalled",
			age.Round(time.Millisecond), r.cfg.ReadyTimeout)
	}
	return nil
}

// heartbeatIn takes a heartbeat row out of a live batch: its row is
// removed with the batch's acknowledgement, and nothing is published.
func (r *Relay) heartbeatIn(a *ack, e Event) bool {
	seq, ok := r.beats.of(e)
	if ok {
		a.heartbeat = max(a.heartbeat, seq)
	}
	return ok
}

// probeSink is the durability stage's check of a flight carrying a
// heartbeat: the heartbeat counts only if the sink still accepts messages.
func (r *Relay) probeSink(ctx context.Context, a *ack) {
	if a.heartbeat == 0 {
		return
	}
	if err := r.sink.Ready(ctx); err != nil {
		r.log.Debug("a heartbeat found the sink not ready", "err", err)
		a.heartbeat = 0
	}
}
