package contract_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
)

func TestMain(m *testing.M) { pgtest.Main(m, testbin.Cleanup) }

// readers are the two sources every test here runs with.
var readers = []string{"poll", "cdc"}

// eachReader runs test, in parallel with the other tests, as one subtest
// per reader, each with an env of its own and its context (see newEnv).
func eachReader(t *testing.T, test func(t *testing.T, ctx context.Context, e *relayEnv)) {
	t.Parallel()
	for _, source := range readers {
		t.Run(source, func(t *testing.T) {
			e, ctx := newEnv(t, source)
			test(t, ctx, e)
		})
	}
}

// relayEnv is one test's migrated database, data directory and binary,
// and the reader its relay runs.
type relayEnv struct {
	t       *testing.T
	url     string
	bin     string
	dataDir string
	addr    string
	source  string
	extra   []string
}

// newEnv returns a fresh env whose relay runs source, and the test's
// context, which ends after 3 minutes.
func newEnv(t *testing.T, source string, extra ...string) (*relayEnv, context.Context) {
	t.Helper()
	url, bin := e2e.Migrated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	return &relayEnv{t: t, url: url, bin: bin, dataDir: e2e.DataDir(t), addr: e2e.FreeAddr(t), source: source, extra: extra}, ctx
}

// start runs the relay and waits until it leads (for cdc: its slot
// exists, so what is written next comes through the WAL).
func (e *relayEnv) start() *e2e.Proc {
	e.t.Helper()
	args := append([]string{"run", "--database-url", e.url, "--data-dir", e.dataDir, "--http-addr", e.addr,
		"--kafka-addr", "", "--source", e.source, "--poll-interval", "200ms", "--heartbeat-interval", "200ms", "--leader-lease", "1s"}, e.extra...)
	p := e2e.Start(e.t, e.bin, nil, args...)
	e2e.WaitRole(e.t, p, "leader", 30*time.Second)
	if e.source == "cdc" {
		conn := pgtest.Connect(e.t, e.url)
		defer conn.Close(context.Background())
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) { // condition poll
			var ok bool
			err := conn.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM outbox.cdc_slots WHERE consistent_lsn IS NOT NULL)`).Scan(&ok)
			if err != nil {
				e.t.Fatal(err)
			}
			if ok {
				break
			}
			if time.Now().After(deadline) {
				e.t.Fatal("the WAL reader has not created its slot after 30 s")
			}
		}
	}
	return p
}

// killLoop SIGKILLs the relay at least kills times while writeDone has not
// reported, then drains the outbox and stops the last relay with SIGTERM.
func (e *relayEnv) killLoop(ctx context.Context, p *e2e.Proc, writeDone <-chan error, kills int) int {
	e.t.Helper()
	p, n, _ := e2e.KillLoop{
		Locker: pgtest.Connect(e.t, e.url), Rand: rand.New(rand.NewPCG(11, uint64(len(e.source)))), MinKills: kills,
		Every:     [2]time.Duration{200 * time.Millisecond, 800 * time.Millisecond},
		Hold:      [2]time.Duration{100 * time.Millisecond, 300 * time.Millisecond},
		Restart:   e.start,
		Published: e2e.LogRecords(e.dataDir),
	}.Run(e.t, ctx, p, writeDone)
	e2e.WaitDrained(e.t, e.url, "outbox", 2*time.Minute)
	p.Stop(time.Minute)
	return n
}
