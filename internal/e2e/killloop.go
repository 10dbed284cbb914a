package e2e

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/outboxrelay/relay/internal/broker"
)

// KillLoop SIGKILLs a relay at random moments while writers run.
type KillLoop struct {
	// Locker is a connection used to hold acknowledgements back.
	Locker *pgx.Conn
	Rand   *rand.Rand
	// MinKills is the least number of kills, writers or not.
	MinKills int
	// Every is the range of the pause before each kill.
	Every [2]time.Duration
	// Hold is the range of how long acknowledgements are held back before
	// every third kill, so that it lands between the sink's acknowledgement
	// and Postgres's.
	Hold [2]time.Duration
	// Restart starts the next relay.
	Restart func() *Proc
	// Killed, when set, sees each killed relay (to count its log lines).
	Killed func(*Proc)
	// Published, when set, counts the records in the destination: a kill
	// with acknowledgements held back then waits until the count grew
	// during the hold, so that it surely lands between the sink's
	// acknowledgement and Postgres's (see waitPublished).
	Published func() int64
	// More, with Published set, writes a few more events the way the
	// writers do (into the same ledger). Once the writers finished, a
	// kill loop none of whose held kills has landed yet (the destination
	// never grew during a hold: on a slow machine the writers may finish
	// before the relay publishes) holds again, runs More inside the hold
	// and kills after the destination grew, until one landed. A test that
	// needs a kill between the two acknowledgements (repeats at least
	// once, skipped re-deliveries exactly once) sets it, so that it never
	// depends on the machine's speed.
	More func(ctx context.Context) error
}

// maxLandingTries bounds the extra held kills Run makes for a landing.
const maxLandingTries = 5

func (k KillLoop) between(r [2]time.Duration) time.Duration {
	return r[0] + time.Duration(k.Rand.Int64N(int64(r[1]-r[0])+1))
}

// Run kills and restarts p until writeDone has reported and MinKills kills
// happened (and, with More set, one held kill landed). It returns the
// running relay, the number of kills and how many of them held
// acknowledgements back and landed: the destination grew during the hold
// (without Published, every held kill counts).
func (k KillLoop) Run(t testing.TB, ctx context.Context, p *Proc, writeDone <-chan error) (last *Proc, kills, held int) {
	t.Helper()
	writing, extra := true, 0
	needLanding := func() bool { return k.More != nil && k.Published != nil && held == 0 }
	for writing || kills < k.MinKills || needLanding() {
		select {
		case err := <-writeDone:
			if err != nil {
				t.Fatalf("writers: %v", err)
			}
			writing = false
		case <-time.After(k.between(k.Every)):
		}
		more := !writing && needLanding()
		if more {
			if extra == maxLandingTries {
				t.Fatalf("%d kills, none with acknowledgements held back landed after the destination grew, %d of them with more events written during the hold", kills, extra)
			}
			extra++
		}
		if kills%3 == 0 || more {
			if k.hold(t, ctx, p, more) {
				held++
			}
		}
		p.Kill()
		kills++
		if k.Killed != nil {
			k.Killed(p)
		}
		p = k.Restart()
	}
	return p, kills, held
}

// hold holds acknowledgements back and kills p during the hold, once the
// destination grew; with more it runs More inside the hold. It reports
// whether the kill landed (always true without Published).
func (k KillLoop) hold(t testing.TB, ctx context.Context, p *Proc, more bool) bool {
	t.Helper()
	// A relay still starting reads its checkpoint, which the hold locks:
	// wait until it publishes before holding.
	k.waitGrowth(ctx, k.published())
	var before int64
	wrote := make(chan error, 1)
	landed := false
	holdAcks(t, ctx, k.Locker, k.between(k.Hold), func() {
		before = k.published()
		if more {
			go func() { wrote <- k.More(ctx) }()
		}
	}, func() {
		landed = k.waitPublished(ctx, before)
		p.Kill()
	})
	if more {
		if err := <-wrote; err != nil {
			t.Fatalf("writing more events during a hold: %v", err)
		}
	}
	return landed || k.Published == nil
}

// published is the destination's record count, 0 without Published.
func (k KillLoop) published() int64 {
	if k.Published == nil {
		return 0
	}
	return k.Published()
}

// waitPublished, with Published set, waits (at most 5 s) until the
// destination holds more records than before, its count once the hold
// took its lock, then 300 ms more: the kill then lands after the sink
// acknowledged records whose Postgres acknowledgement the hold keeps back
// (a transactional sink's records count before their commit, which a
// cluster may report as committed offsets: the commit that follows gets
// time to land). Without writers there is nothing to publish and the
// kill comes after the wait. It reports whether the destination grew.
func (k KillLoop) waitPublished(ctx context.Context, before int64) bool {
	if !k.waitGrowth(ctx, before) {
		return false
	}
	time.Sleep(300 * time.Millisecond)
	return true
}

// waitGrowth waits, at most 5 s, until Published counts more than before,
// and reports whether it did; without Published it returns at once.
func (k KillLoop) waitGrowth(ctx context.Context, before int64) bool {
	if k.Published == nil {
		return false
	}
	for deadline := time.Now().Add(5 * time.Second); ctx.Err() == nil && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if k.Published() > before {
			return true
		}
	}
	return false
}

// LogRecords returns a counter of the records in the embedded broker's
// data directory, read from its files (safe while the relay runs): the sum
// of every partition's end offset, or -1 when the files cannot be read.
// It serves KillLoop.Published for a relay without a Kafka listener.
func LogRecords(dataDir string) func() int64 {
	return func() int64 {
		ins, err := broker.Inspect(context.Background(), dataDir)
		if err != nil {
			return -1
		}
		var n int64
		for _, t := range ins.Topics {
			for _, p := range t.Partitions {
				n += p.LogEndOffset
			}
		}
		return n
	}
}

// MoreOf is a KillLoop.More that writes n more events of cfg's shape into
// ledger (each key's sequence continues where the writers left it).
func MoreOf(cfg WriterConfig, n int, ledger *Ledger) func(context.Context) error {
	cfg.Events = n
	return func(ctx context.Context) error { return Write(ctx, cfg, ledger) }
}
