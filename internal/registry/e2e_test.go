package registry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/registry"
)

// payloadSchema is a JSON Schema the e2e writers' payloads match.
const payloadSchema = `{"$schema":"http://json-schema.org/draft-07/schema#","type":"object",
"properties":{"id":{"type":"string"},"key":{"type":"string"},"seq":{"type":"integer","minimum":0},"pad":{"type":"string"}},
"required":["id","key","seq"]}`

// registerOver registers schema under subject through the REST API at addr.
func registerOver(t *testing.T, addr, subject, typ, schema string) int {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"schema": schema, "schemaType": typ})
	resp, err := http.Post("http://"+addr+"/subjects/"+subject+"/versions", "application/vnd.schemaregistry.v1+json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		ID      int    `json:"id"`
		Message string `json:"message"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusOK || out.ID == 0 {
		t.Fatalf("registering %s: %d %s", subject, resp.StatusCode, out.Message)
	}
	return out.ID
}

// TestContractKills: on a topic with a JSON Schema contract, 8 writers
// commit valid events while another commits events that break the
// contract, and the relay is SIGKILLed at random moments (every third kill
// while its acknowledgements are held back). Every valid event must be in
// the log exactly once in per-key order, every invalid one in the dead
// letters exactly once with reason schema_invalid, and nothing else
// anywhere.
func TestContractKills(t *testing.T) {
	ctx := context.Background()
	url, bin := e2e.Migrated(t)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	args := []string{"run", "--database-url", url, "--data-dir", dataDir, "--http-addr", addr, "--kafka-addr", "",
		"--poll-interval", "100ms", "--leader-lease", "1s", "--schema-registry", "--schema-topics", "orders"}
	start := func() *e2e.Proc { return e2e.Start(t, bin, nil, args...) }
	p := start()
	e2e.WaitRole(t, p, "leader", 30*time.Second)
	registerOver(t, addr, "orders-value", registry.TypeJSON, payloadSchema)

	ledger := e2e.NewLedger()
	writeDone := make(chan error, 1)
	cfg := e2e.CrashLoad(url, 6000, 300)
	go func() { writeDone <- e2e.Write(ctx, cfg, ledger) }()
	const bad = 60
	badDone := make(chan error, 1)
	go func() {
		admin := pgtest.Connect(t, url)
		for i := range bad {
			payload := fmt.Sprintf(`{"id":"bad-%d","key":"bad-%d","seq":"not a number"}`, i, i%3)
			if _, err := admin.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', $1, $2)`, fmt.Sprintf("bad-%d", i%3), []byte(payload)); err != nil {
				badDone <- err
				return
			}
			time.Sleep(50 * time.Millisecond) // load pacing: bad events spread over the kill loop
		}
		badDone <- nil
	}()
	loop := e2e.KillLoop{Locker: pgtest.Connect(t, url), Rand: rand.New(rand.NewPCG(22, 10)), MinKills: 4,
		Every: [2]time.Duration{500 * time.Millisecond, 2 * time.Second}, Hold: [2]time.Duration{300 * time.Millisecond, time.Second},
		Restart: start}
	p, kills, _ := loop.Run(t, ctx, p, writeDone)
	if err := <-badDone; err != nil {
		t.Fatal(err)
	}
	e2e.WaitDrained(t, url, "outbox", 2*time.Minute)
	// The last restart may still be starting: SIGTERM before its signal
	// handler is installed would kill it.
	e2e.WaitRole(t, p, "leader", 30*time.Second)
	p.Stop(time.Minute)

	n := e2e.CheckLog(t, dataDir, ledger)
	admin := pgtest.Connect(t, url)
	var total, distinct, invalid int
	var sample string
	if err := admin.QueryRow(ctx, `SELECT count(*), count(DISTINCT event_id), count(*) FILTER (WHERE reason = 'schema_invalid'), coalesce(min(error), '')
FROM outbox.dead_letters`).Scan(&total, &distinct, &invalid, &sample); err != nil {
		t.Fatal(err)
	}
	if total != bad || distinct != bad || invalid != bad {
		t.Fatalf("dead letters: %d rows, %d distinct events, %d schema_invalid; want %d of each", total, distinct, invalid, bad)
	}
	if !strings.Contains(sample, `breaks the contract of "orders-value" version 1`) || !strings.Contains(sample, "seq") {
		t.Fatalf("a dead letter's error does not say what broke: %s", sample)
	}
	t.Logf("%d valid events exactly once in per-key order, %d invalid ones dead-lettered once each, through %d kills", n, bad, kills)
}

// TestContractHoldKey: under the hold-key policy an event that breaks the
// contract holds its key: the key's later events wait, in order, other
// keys flow; once the dead letter is fixed and retried, the key's events
// are published in their order.
func TestContractHoldKey(t *testing.T) {
	ctx := context.Background()
	url, bin := e2e.Migrated(t)
	dataDir, addr := e2e.DataDir(t), e2e.FreeAddr(t)
	p := e2e.Start(t, bin, nil, "run", "--database-url", url, "--data-dir", dataDir, "--http-addr", addr, "--kafka-addr", "",
		"--poll-interval", "100ms", "--schema-registry", "--schema-topics", "orders", "--dead-letter-policy-topics", "orders=hold-key")
	e2e.WaitRole(t, p, "leader", 30*time.Second)
	registerOver(t, addr, "orders-value", registry.TypeJSON, payloadSchema)
	admin := pgtest.Connect(t, url)
	insert := func(key string, seq int, bad bool) {
		t.Helper()
		payload := fmt.Sprintf(`{"id":"%s-%d","key":"%s","seq":%d}`, key, seq, key, seq)
		if bad {
			payload = fmt.Sprintf(`{"id":"%s-%d","key":"%s","seq":"%d"}`, key, seq, key, seq)
		}
		if _, err := admin.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload) VALUES ('orders', $1, $2)`, key, []byte(payload)); err != nil {
			t.Fatal(err)
		}
	}
	for seq := range 6 {
		insert("held", seq, seq == 2)
		insert("free", seq, false)
	}
	e2e.WaitDrained(t, url, "outbox", time.Minute)
	var holding, held int
	if err := admin.QueryRow(ctx, `SELECT count(*) FILTER (WHERE holds AND reason = 'schema_invalid'), count(*) FILTER (WHERE held_by IS NOT NULL)
FROM outbox.dead_letters WHERE key = 'held'`).Scan(&holding, &held); err != nil {
		t.Fatal(err)
	}
	if holding != 1 || held != 3 {
		t.Fatalf("%d dead letters hold the key and %d events are held; want 1 and 3", holding, held)
	}
	if _, err := admin.Exec(ctx, `UPDATE outbox.dead_letters SET payload = convert_to('{"id":"held-2","key":"held","seq":2}', 'UTF8') WHERE holds`); err != nil {
		t.Fatal(err)
	}
	retry := e2e.Start(t, bin, nil, "dead-letters", "retry", "--database-url", url, "--reason", "schema_invalid")
	if code := retry.Wait(time.Minute); code != 0 {
		t.Fatalf("dead-letters retry: exit %d: %s", code, retry.Output())
	}
	deadline := time.Now().Add(time.Minute)
	for {
		var waiting int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM outbox.dead_letters WHERE holds OR (held_by IS NOT NULL AND resolution IS NULL)`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d dead letters still hold or are held a minute after the retry", waiting)
		}
		time.Sleep(50 * time.Millisecond) // a condition poll: the retry happens in the relay process
	}
	p.Stop(time.Minute)
	seqs := map[string][]int{}
	for _, rec := range e2e.ReadLog(t, dataDir, "orders") {
		var pl e2e.Payload
		if err := json.Unmarshal(rec.Value, &pl); err != nil {
			t.Fatalf("record %s: %v", rec.Value, err)
		}
		seqs[pl.Key] = append(seqs[pl.Key], pl.Seq)
	}
	for _, key := range []string{"held", "free"} {
		if fmt.Sprint(seqs[key]) != "[0 1 2 3 4 5]" {
			t.Fatalf("key %s in the log: %v, want [0 1 2 3 4 5]", key, seqs[key])
		}
	}
}
