package e2e

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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
			// A relay still starting publishes nothing while the
			// acknowledgements are held, and the kill would not land
			// between the sink's acknowledgement and Postgres's: wait
			// until it reads and publishes (ready) first.
			k.waitPublishing(ctx, p)
			HoldAcks(t, ctx, k.Locker, k.between(k.Hold), p.Kill)
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

// waitPublishing waits, at most 30 s, until p answers ready: its pipeline
// runs and its heartbeats reach the log. A relay without an HTTP address
// is not waited for.
func (k KillLoop) waitPublishing(ctx context.Context, p *Proc) {
	if p.HTTPAddr == "" {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if ready, _ := p.Ready(); ready {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}
