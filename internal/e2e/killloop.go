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
}

func (k KillLoop) between(r [2]time.Duration) time.Duration {
	return r[0] + time.Duration(k.Rand.Int64N(int64(r[1]-r[0])+1))
}

// Run kills and restarts p until writeDone has reported and MinKills kills
// happened. It returns the running relay, the number of kills and how many
// of them held acknowledgements back.
func (k KillLoop) Run(t testing.TB, ctx context.Context, p *Proc, writeDone <-chan error) (last *Proc, kills, held int) {
	t.Helper()
	writing := true
	for writing || kills < k.MinKills {
		select {
		case err := <-writeDone:
			if err != nil {
				t.Fatalf("writers: %v", err)
			}
			writing = false
		case <-time.After(k.between(k.Every)):
		}
		if kills%3 == 0 {
			// A relay still starting reads its checkpoint, which the
			// hold locks: wait until it publishes before holding.
			k.waitGrowth(ctx, k.published())
			var before int64
			holdAcks(t, ctx, k.Locker, k.between(k.Hold), func() { before = k.published() }, func() {
				k.waitPublished(ctx, before)
				p.Kill()
			})
			held++
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
// kill comes after the wait.
func (k KillLoop) waitPublished(ctx context.Context, before int64) {
	if k.waitGrowth(ctx, before) {
		time.Sleep(300 * time.Millisecond)
	}
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
