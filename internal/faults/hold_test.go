package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
)

// heldKeys are the keys a poison event holds in TestHoldKeyKills; the other
// writers never use them.
var heldKeys = []string{"held-0", "held-1", "held-2"}

// writeHeld commits events seq from..to-1 on each held key, one event per
// transaction, the key's poison (a forged relay-* header) at seq poison,
// and records them in the ledger.
func writeHeld(ctx context.Context, url string, ledger *e2e.Ledger, from, to, poison int, pause time.Duration) (map[string]string, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	poisons := map[string]string{}
	for seq := from; seq < to; seq++ {
		for _, key := range heldKeys {
			p := e2e.Payload{ID: fmt.Sprintf("%s-%d", key, seq), Key: key, Seq: seq}
			body, _ := json.Marshal(p)
			headers := `{"test":"e2e"}`
			if seq == poison {
				headers = `{"test":"e2e","relay-event-id":"forged"}`
				poisons[key] = p.ID
			}
			if _, err := conn.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload, headers) VALUES ('orders', $1, $2, $3)`,
				key, body, headers); err != nil {
				return nil, err
			}
			ledger.Record(p)
		}
		time.Sleep(pause) // load pacing: the writers' pause between transactions
	}
	return poisons, nil
}

// TestHoldKeyKills is the acceptance test of the hold-key dead-letter
// policy: a poison event in the middle of three keys' streams holds their
// later events while 8 writers on 400 other keys flow, through SIGKILLs of
// the relay (every third while its acknowledgements are held back). Then
// the first key's poison is fixed and retried, the second's discarded, the
// third's retried unfixed (it fails again and keeps holding) and then fixed
// and retried, with more events written to the held keys meanwhile and a
// SIGKILL in the middle of the releases. The log must hold every committed
// event exactly once in per-key order (the discarded one excepted), and no
// held event before its key was released.
func TestHoldKeyKills(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ledger := e2e.NewLedger()
	r := e.newNode("relay", "--dead-letter-policy-topics", "orders=hold-key").start()

	writeDone := make(chan error, 1)
	go func() { writeDone <- e2e.Write(ctx, e.writers(8000), ledger) }()
	heldDone := make(chan map[string]string, 1)
	go func() {
		poisons, err := writeHeld(ctx, e.url, ledger, 0, 60, 20, 40*time.Millisecond)
		if err != nil {
			t.Errorf("writing the held keys: %v", err)
		}
		heldDone <- poisons
	}()
	loop := e2e.KillLoop{Locker: pgtest.Connect(t, e.url), Rand: rand.New(rand.NewPCG(16, 3)), MinKills: 5,
		Every: [2]time.Duration{500 * time.Millisecond, 2 * time.Second}, Hold: [2]time.Duration{300 * time.Millisecond, time.Second},
		Restart: func() *e2e.Proc { return r.start().proc }}
	_, kills, _ := loop.Run(t, ctx, r.proc, writeDone)
	poisons := <-heldDone
	if len(poisons) != len(heldKeys) {
		t.Fatalf("poisons written: %v", poisons)
	}

	// Everything else drains; the held events wait in the dead letters.
	e2e.WaitDrained(t, e.url, "outbox", 2*time.Minute)
	held := func() (holding, waiting int64) {
		if err := e.admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE holds), count(*) FILTER (WHERE held_by IS NOT NULL AND resolution IS NULL)
FROM outbox.dead_letters`).Scan(&holding, &waiting); err != nil {
			t.Fatal(err)
		}
		return holding, waiting
	}
	if holding, waiting := held(); holding != 3 || waiting != 3*39 {
		t.Fatalf("%d dead letters hold keys and %d events are held; want 3 and 117", holding, waiting)
	}
	e2e.WaitRole(t, r.proc, "leader", 30*time.Second)
	waitFor(t, 30*time.Second, "the held-key metrics", func() bool {
		return e2e.Metric(t, r.addr, "relay_held_keys") == 3 && e2e.Metric(t, r.addr, "relay_held_events") == 117
	})

	st := e2e.Start(t, e.bin, nil, "status", "--json", "--database-url", e.url, "--http-addr", r.addr)
	if code := st.Wait(time.Minute); code != 0 {
		t.Fatalf("relay status: exit %d: %s", code, st.Output())
	}
	if out := st.Output(); !strings.Contains(out, `"held_keys": 3`) || !strings.Contains(out, `"held_events": 117`) {
		t.Fatalf("relay status does not show 3 held keys and 117 held events:\n%s", out)
	}

	// Nothing of a held key after its poison is in the log.
	r.stop()
	maxSeq := map[string]int{}
	for _, rec := range e2e.ReadLog(t, e.dataDir, "orders") {
		var p e2e.Payload
		if json.Unmarshal(rec.Value, &p) == nil && slices.Contains(heldKeys, p.Key) {
			maxSeq[p.Key] = max(maxSeq[p.Key], p.Seq)
		}
	}
	for _, k := range heldKeys {
		if maxSeq[k] != 19 {
			t.Fatalf("key %s: the log's last event is seq %d while held behind seq 20", k, maxSeq[k])
		}
	}
	r.start()

	cli := func(args ...string) {
		t.Helper()
		p := e2e.Start(t, e.bin, nil, append([]string{"dead-letters", args[0], "--database-url", e.url}, args[1:]...)...)
		if code := p.Wait(time.Minute); code != 0 {
			t.Fatalf("relay %v: exit %d: %s", args, code, p.Output())
		}
	}
	dlOf := func(key string) string {
		var id int64
		if err := e.admin.QueryRow(ctx, `SELECT id FROM outbox.dead_letters WHERE holds AND key = $1`, key).Scan(&id); err != nil {
			t.Fatalf("the dead letter holding %s: %v", key, err)
		}
		return strconv.FormatInt(id, 10)
	}
	fix := func(key string) {
		if _, err := e.admin.Exec(ctx, `UPDATE outbox.dead_letters SET headers = '{"test":"e2e"}' WHERE holds AND key = $1`, key); err != nil {
			t.Fatal(err)
		}
	}
	// held-2 retried unfixed: it fails again and stays held.
	cli("retry", dlOf("held-2"))
	waitFor(t, 30*time.Second, "the unfixed retry to fail again", func() bool {
		var unresolved bool
		e.admin.QueryRow(ctx, `SELECT resolution IS NULL FROM outbox.dead_letters WHERE holds AND key = 'held-2'`).Scan(&unresolved)
		return unresolved
	})
	if _, waiting := held(); waiting != 3*39 {
		t.Fatalf("%d events held after a failed retry, want 117", waiting)
	}

	// More events on the held keys, then the releases, with a kill among
	// them (while acknowledgements are held back).
	more := make(chan error, 1)
	go func() {
		_, err := writeHeld(ctx, e.url, ledger, 60, 80, -1, 20*time.Millisecond)
		more <- err
	}()
	fix("held-0")
	cli("retry", dlOf("held-0"))
	cli("discard", "--note", "test: given up", dlOf("held-1"))
	e2e.HoldAcks(t, ctx, loop.Locker, 500*time.Millisecond, r.proc.Kill)
	r.proc.Kill()
	r.start()
	fix("held-2")
	cli("retry", dlOf("held-2"))
	if err := <-more; err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the held keys to be released", func() bool {
		holding, waiting := held()
		return holding == 0 && waiting == 0
	})
	e2e.WaitDrained(t, e.url, "outbox", time.Minute)
	r.stop()

	delete(ledger.Committed, poisons["held-1"])
	n := e.checkAll(ledger)
	t.Logf("%d events exactly once in per-key order through %d kills; 3 keys held behind a poison and released in order", n, kills+1)
}
