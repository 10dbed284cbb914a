// Package e2e drives the real relay binary for end-to-end tests: it runs
// and kills relay processes, writes outbox events from concurrent writers
// that remember what they committed, and checks the embedded log against
// that record: every committed event exactly once, per-key order, nothing
// from a rolled-back transaction.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/procstat"
)

// Proc is a running relay process.
type Proc struct {
	t       testing.TB
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	logPath string
	// HTTPAddr is where the process serves /readyz and /metrics.
	HTTPAddr string
}

// Start runs the relay binary with args and env added to the environment.
// Its output goes to a log file in the test's temp dir, whose last lines
// are printed if the test fails (few, so that a CI excerpt of a test that
// ran many relays still shows the test's own errors).
func Start(t testing.TB, bin string, env []string, args ...string) *Proc {
	t.Helper()
	logFile, err := os.CreateTemp(t.TempDir(), "relay-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &Proc{t: t, cmd: cmd, done: make(chan struct{}), logPath: logFile.Name()}
	for i, a := range args {
		if a == "--http-addr" && i+1 < len(args) {
			p.HTTPAddr = args[i+1]
		}
	}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			out, _ := os.ReadFile(p.logPath)
			t.Logf("relay (pid %d) output, last 25 lines:\n%s", cmd.Process.Pid, tail(out, 25))
		}
	})
	return p
}

func tail(b []byte, lines int) []byte {
	all := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return bytes.Join(all, []byte("\n"))
}

// Kill sends SIGKILL and waits for the process to die.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Signal sends sig.
func (p *Proc) Signal(sig os.Signal) { p.cmd.Process.Signal(sig) }

// Wait waits up to timeout for the process to exit and returns its exit
// code, or -1 if it did not exit in time.
func (p *Proc) Wait(timeout time.Duration) int {
	select {
	case <-p.done:
		if p.err == nil {
			return 0
		}
		if ee, ok := p.err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		return -1
	case <-time.After(timeout):
		return -1
	}
}

// Stop sends SIGTERM and fails the test unless the process exits 0 within
// timeout.
func (p *Proc) Stop(timeout time.Duration) {
	p.t.Helper()
	p.Signal(syscall.SIGTERM)
	if code := p.Wait(timeout); code != 0 {
		p.t.Fatalf("relay at %s exited %d after SIGTERM (want 0 within %v)", p.HTTPAddr, code, timeout)
	}
}

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// PeakRSS returns the process's peak resident set size so far; call it
// while the process is alive.
func (p *Proc) PeakRSS() (int64, error) { return procstat.PeakRSS(p.cmd.Process.Pid) }

// Output returns what the process has logged so far.
func (p *Proc) Output() string {
	out, _ := os.ReadFile(p.logPath)
	return string(out)
}

// Role asks /readyz for the process's role ("" when it does not answer).
func (p *Proc) Role() string {
	_, role := p.Ready()
	return role
}

// Ready asks /readyz whether the process is ready, and its role.
func (p *Proc) Ready() (bool, string) {
	ready, role, _ := p.readyz()
	return ready, role
}

// ReadyReason asks /readyz why the process is not ready ("" when it is,
// or does not answer).
func (p *Proc) ReadyReason() string {
	_, _, reason := p.readyz()
	return reason
}

func (p *Proc) readyz() (ready bool, role, reason string) {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + p.HTTPAddr + "/readyz")
	if err != nil {
		return false, "", ""
	}
	defer resp.Body.Close()
	var body struct {
		Role   string `json:"role"`
		Ready  bool   `json:"ready"`
		Reason string `json:"reason"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	return body.Ready && resp.StatusCode == http.StatusOK, body.Role, body.Reason
}

// Payload is what a test writer puts in each event.
type Payload struct {
	// ID is unique per event across the test.
	ID string `json:"id"`
	// Key is the event's key; Seq counts that key's events in commit
	// order (the key's writer runs one transaction at a time).
	Key string `json:"key"`
	Seq int    `json:"seq"`
}

// Ledger records what writers committed and rolled back.
type Ledger struct {
	mu         sync.Mutex
	Committed  map[string]Payload
	RolledBack map[string]bool
	// runs counts Write calls, so event ids stay unique across them.
	runs int
	// nextSeq continues each key's sequence across Write calls.
	nextSeq map[string]int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{Committed: map[string]Payload{}, RolledBack: map[string]bool{}, nextSeq: map[string]int{}}
}

// Len is the number of committed events recorded so far.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.Committed)
}

// Record adds an event committed outside Write.
func (l *Ledger) Record(p Payload) { l.Note([]Payload{p}, true) }

// Note records ps as committed or rolled back.
func (l *Ledger) Note(ps []Payload, committed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range ps {
		if committed {
			l.Committed[p.ID] = p
			l.nextSeq[p.Key] = max(l.nextSeq[p.Key], p.Seq+1)
		} else {
			l.RolledBack[p.ID] = true
		}
	}
}

// WriterConfig shapes a write load.
type WriterConfig struct {
	URL     string
	Schema  string
	Topic   string
	Writers int
	// Events is the total number of committed events to write.
	Events int
	Keys   int
	// PerTx is the most events per transaction (each transaction writes
	// 1..PerTx events on one or more of its writer's keys).
	PerTx int
	// RollbackEvery rolls back one transaction in this many (0: never).
	RollbackEvery int
	PayloadBytes  int
}

// Write runs the writers until Events events are committed. Writer w owns
// the keys k with k % Writers == w, so a key's transactions never overlap
// and its events must appear in the log in Seq order.
func Write(ctx context.Context, cfg WriterConfig, ledger *Ledger) error {
	ledger.mu.Lock()
	ledger.runs++
	run := ledger.runs
	seqs := make(map[string]int, len(ledger.nextSeq))
	for k, v := range ledger.nextSeq {
		seqs[k] = v
	}
	ledger.mu.Unlock()
	return EachWriter(cfg, func(w, n int) error {
		return writer(ctx, cfg, w, n, run, seqs, ledger)
	})
}

// CrashLoad is the load of the crash tests: 8 writers of up to 10 events
// a transaction into outbox.events, topic orders, 120-byte payloads, one
// transaction in 25 rolled back.
func CrashLoad(url string, events, keys int) WriterConfig {
	return WriterConfig{URL: url, Schema: "outbox", Topic: "orders", Writers: 8, Events: events, Keys: keys,
		PerTx: 10, RollbackEvery: 25, PayloadBytes: 120}
}

// WriteAsync runs Write in the background; its error (nil when every
// event is committed) arrives on the returned channel.
func WriteAsync(ctx context.Context, cfg WriterConfig, ledger *Ledger) <-chan error {
	done := make(chan error, 1)
	go func() { done <- Write(ctx, cfg, ledger) }()
	return done
}

// EachWriter runs write for each of cfg.Writers writers at once, writer w
// to write n of cfg.Events events (the first takes the remainder), and
// returns the first error.
func EachWriter(cfg WriterConfig, write func(w, n int) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, cfg.Writers)
	perWriter := cfg.Events / cfg.Writers
	for w := 0; w < cfg.Writers; w++ {
		n := perWriter
		if w == 0 {
			n += cfg.Events - perWriter*cfg.Writers
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := write(w, n); err != nil {
				errs <- fmt.Errorf("writer %d: %w", w, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// EachConn runs write for each of n writers at once, writer w (0 to n-1)
// on a connection of its own to url, closed when write returns, and
// returns the first error.
func EachConn(ctx context.Context, url string, n int, write func(conn *pgx.Conn, w int) error) error {
	return EachWriter(WriterConfig{Writers: n}, func(w, _ int) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		return write(conn, w)
	})
}

func writer(ctx context.Context, cfg WriterConfig, w, n, run int, startSeq map[string]int, ledger *Ledger) error {
	conn, err := pgx.Connect(ctx, cfg.URL)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	gen := NewTxGen(cfg, w, 42, startSeq)
	for txNo, written := 1, 0; written < n; txNo++ {
		wt := gen.Next(txNo, fmt.Sprintf("r%d-w%d-t%d", run, w, txNo), n-written)
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		if err := gen.Insert(ctx, tx, wt); err != nil {
			tx.Rollback(ctx)
			return err
		}
		if wt.Rollback {
			if err := tx.Rollback(ctx); err != nil {
				return err
			}
			ledger.Note(wt.Payloads, false)
			continue
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		gen.Committed(wt)
		ledger.Note(wt.Payloads, true)
		written += len(wt.Payloads)
	}
	return nil
}

// A TxGen composes one writer's transactions. Writer w owns the keys k
// with k % Writers == w and numbers each key's events on from startSeq.
type TxGen struct {
	cfg    WriterConfig
	rng    *rand.Rand
	keys   []string
	seq    map[string]int
	pad    int
	insert string
}

// WriterTx is one composed transaction.
type WriterTx struct {
	Payloads []Payload
	// Rollback says the writer rolls this transaction back.
	Rollback     bool
	keys, bodies []string
	next         map[string]int
}

// NewTxGen returns writer w's transaction generator; seed fixes its random
// choices.
func NewTxGen(cfg WriterConfig, w int, seed uint64, startSeq map[string]int) *TxGen {
	g := &TxGen{cfg: cfg, rng: rand.New(rand.NewPCG(uint64(w), seed)), seq: map[string]int{},
		pad: max(cfg.PayloadBytes-60, 0),
		// The server appends the padding, a "pad" field of that many x's,
		// to each JSON body: writers of large events cost the test
		// process nothing for it.
		insert: `INSERT INTO ` + pgx.Identifier{cfg.Schema, "events"}.Sanitize() +
			` (topic, key, payload, headers) SELECT $1, k, convert_to(CASE WHEN $4::int > 0 THEN left(p, -1) || ',"pad":"' || repeat('x', $4) || '"}' ELSE p END, 'UTF8'),
    '{"test":"e2e"}' FROM unnest($2::text[], $3::text[]) AS e(k, p)`}
	for k := w; k < cfg.Keys; k += cfg.Writers {
		key := fmt.Sprintf("key-%d", k)
		g.keys = append(g.keys, key)
		g.seq[key] = startSeq[key]
	}
	return g
}

// Next composes transaction txNo: 1 to PerTx events (at most left) on the
// writer's keys, with ids prefix-0, prefix-1, ...; every RollbackEvery-th
// transaction is to be rolled back.
func (g *TxGen) Next(txNo int, prefix string, left int) WriterTx {
	count := min(1+g.rng.IntN(g.cfg.PerTx), left)
	wt := WriterTx{Rollback: g.cfg.RollbackEvery > 0 && txNo%g.cfg.RollbackEvery == 0, next: map[string]int{}}
	for i := 0; i < count; i++ {
		k := g.keys[g.rng.IntN(len(g.keys))]
		s, ok := wt.next[k]
		if !ok {
			s = g.seq[k]
		}
		wt.next[k] = s + 1
		p := Payload{ID: fmt.Sprintf("%s-%d", prefix, i), Key: k, Seq: s}
		body, _ := json.Marshal(p)
		wt.Payloads, wt.keys, wt.bodies = append(wt.Payloads, p), append(wt.keys, k), append(wt.bodies, string(body))
	}
	return wt
}

// Insert writes wt's events in tx.
func (g *TxGen) Insert(ctx context.Context, tx pgx.Tx, wt WriterTx) error {
	_, err := tx.Exec(ctx, g.insert, g.cfg.Topic, wt.keys, wt.bodies, g.pad)
	return err
}

// Committed moves the keys' sequence numbers past a committed wt.
func (g *TxGen) Committed(wt WriterTx) {
	for k, s := range wt.next {
		g.seq[k] = s
	}
}

// WaitDrained waits until the outbox table is empty.
func WaitDrained(t testing.TB, url, schema string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	for {
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "events"}.Sanitize()).Scan(&n); err != nil {
			t.Fatalf("waiting for the outbox to drain (%d rows left): %v", n, err)
		}
		if n == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the outbox still has %d rows after %v", n, timeout)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Record is one record read back from the log.
type Record struct {
	Topic     string
	Partition int32
	Offset    int64
	Key       string
	// KeyBytes is nil for a null key.
	KeyBytes  []byte
	Value     []byte
	Headers   map[string]string
	Timestamp time.Time
	// HeaderList keeps the headers in record order.
	HeaderList []broker.Header
	// ProducerID and ProducerEpoch are the batch's, read from the
	// embedded log (zero in records built otherwise): which writer and
	// session appended the record.
	ProducerID    int64
	ProducerEpoch int16
}

// ReadLog reads every record of topic from a data directory no process
// holds.
func ReadLog(t testing.TB, dataDir, topic string) []Record {
	t.Helper()
	var out []Record
	EachRecord(t, dataDir, topic, func(r Record) { out = append(out, r) })
	return out
}

// EachRecord calls fn with every record of topic in dataDir (a directory
// no process holds), partition by partition in offset order, holding one
// batch at a time: for logs too large to read whole.
func EachRecord(t testing.TB, dataDir, topic string, fn func(Record)) {
	t.Helper()
	EachBatch(t, dataDir, topic, func(part int32, raw []byte) {
		bh, recs, err := broker.DecodeBatch(raw)
		if err != nil {
			t.Fatalf("decoding %s/%d: %v", topic, part, err)
		}
		for _, r := range recs {
			h := map[string]string{}
			for _, hh := range r.Headers {
				h[hh.Key] = string(hh.Value)
			}
			fn(Record{Topic: topic, Partition: part, Offset: r.Offset, Key: string(r.Key), KeyBytes: r.Key,
				Value: r.Value, Headers: h, Timestamp: r.Timestamp, HeaderList: r.Headers,
				ProducerID: bh.ProducerID, ProducerEpoch: bh.ProducerEpoch})
		}
	})
}

// EachBatch calls fn with every record batch of topic in dataDir (a
// directory no process holds), partition by partition in offset order.
func EachBatch(t testing.TB, dataDir, topic string, fn func(partition int32, batch []byte)) {
	t.Helper()
	ctx := context.Background()
	b, err := broker.Open(ctx, broker.Options{Dir: dataDir, JanitorInterval: -1, Logger: discardLogger()})
	if err != nil {
		t.Fatalf("opening the log: %v", err)
	}
	defer b.Close()
	info, err := b.Topic(topic)
	if err != nil {
		t.Fatalf("topic %s: %v", topic, err)
	}
	for p := range info.Partitions {
		part := int32(p)
		start, end, err := b.Offsets(topic, part)
		if err != nil {
			t.Fatal(err)
		}
		for off := start; off < end; {
			res, err := b.Fetch(ctx, topic, part, off, 4<<20)
			if err != nil {
				t.Fatalf("fetch %s/%d@%d: %v", topic, part, off, err)
			}
			next := off
			for raw, err := range broker.Batches(res.Batches) {
				if err != nil {
					t.Fatalf("batches of %s/%d@%d: %v", topic, part, off, err)
				}
				h, err := broker.ParseBatchHeader(raw)
				if err != nil {
					t.Fatal(err)
				}
				if h.LastOffset() < off {
					continue
				}
				fn(part, raw)
				next = h.LastOffset() + 1
			}
			if next == off {
				t.Fatalf("fetch %s/%d@%d returned no batch before the end %d", topic, part, off, end)
			}
			off = next
		}
	}
}

// Check asserts that records hold every committed event exactly once,
// nothing rolled back, and each key's events in Seq order. It returns the
// number of events checked.
func Check(t testing.TB, records []Record, ledger *Ledger) int {
	t.Helper()
	seen := map[string]int{}
	first := map[string]Record{}
	lastSeq := map[string]int{}
	partOf := map[string]int32{}
	violations := NewViolations(t)
	fail := violations.Errorf
	for _, r := range records {
		var p Payload
		if err := json.Unmarshal(r.Value, &p); err != nil {
			fail("record %s/%d@%d: payload %q is not a test payload: %v", r.Topic, r.Partition, r.Offset, r.Value, err)
			continue
		}
		seen[p.ID]++
		switch seen[p.ID] {
		case 1:
			first[p.ID] = r
		case 2:
			f := first[p.ID]
			fail("event %s appears more than once: at %s/%d@%d (producer %d epoch %d, event id %s), again at %s/%d@%d (producer %d epoch %d, event id %s)",
				p.ID, f.Topic, f.Partition, f.Offset, f.ProducerID, f.ProducerEpoch, f.Headers["relay-event-id"],
				r.Topic, r.Partition, r.Offset, r.ProducerID, r.ProducerEpoch, r.Headers["relay-event-id"])
		}
		if ledger.RolledBack[p.ID] {
			fail("event %s from a rolled-back transaction was published at %s/%d@%d", p.ID, r.Topic, r.Partition, r.Offset)
		}
		if r.Key != p.Key {
			fail("event %s has key %q in the log, %q written", p.ID, r.Key, p.Key)
		}
		if r.Headers["relay-event-id"] == "" || r.Headers["test"] != "e2e" {
			fail("event %s lacks its headers: %v", p.ID, r.Headers)
		}
		if part, ok := partOf[p.Key]; ok && part != r.Partition {
			fail("key %s is on partitions %d and %d", p.Key, part, r.Partition)
		}
		partOf[p.Key] = r.Partition
		if last, ok := lastSeq[p.Key]; ok && p.Seq <= last {
			fail("key %s: event seq %d (%s) comes after seq %d at %s/%d@%d", p.Key, p.Seq, p.ID, last, r.Topic, r.Partition, r.Offset)
		} else {
			lastSeq[p.Key] = p.Seq
		}
	}
	CheckCommitted(t, ledger, seen, violations, len(records), "the log")
	return len(records)
}

// CheckLog reads topic orders of the embedded broker's log in dataDir and
// fails unless it holds every committed event exactly once, in per-key
// order, and nothing else (Check, and one record per committed event). It
// returns the number of records.
func CheckLog(t testing.TB, dataDir string, ledger *Ledger) int {
	t.Helper()
	n := Check(t, ReadLog(t, dataDir, "orders"), ledger)
	if n != len(ledger.Committed) {
		t.Fatalf("the log has %d records for %d committed events", n, len(ledger.Committed))
	}
	return n
}

// FreeAddr returns a loopback address with a port free at the moment.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// DataDir returns a fresh directory for a relay's broker.
func DataDir(t testing.TB) string {
	return filepath.Join(t.TempDir(), "data")
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// WriteSteadily writes rounds of cfg.Events events, pausing between rounds,
// until the returned stop is called; stop waits for the round in progress
// and returns the writers' first error.
func WriteSteadily(ctx context.Context, cfg WriterConfig, ledger *Ledger, pause time.Duration) (stop func() error) {
	quit := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for {
			if err := Write(ctx, cfg, ledger); err != nil {
				done <- err
				return
			}
			select {
			case <-quit:
				done <- nil
				return
			case <-time.After(pause):
			}
		}
	}()
	return func() error {
		close(quit)
		return <-done
	}
}

// Violations counts the violations a check of records finds and reports
// the first 20 through t: a check over thousands of records would
// otherwise bury the summary under its errors.
type Violations struct {
	t testing.TB
	n int
}

// NewViolations returns an empty count of violations reported through t.
func NewViolations(t testing.TB) *Violations { return &Violations{t: t} }

// Errorf counts a violation and reports it if it is one of the first 20.
func (v *Violations) Errorf(format string, args ...any) {
	v.t.Helper()
	v.n++
	if v.n <= 20 {
		v.t.Errorf(format, args...)
	}
}

// CheckCommitted fails the test when an event of ledger is missing from
// seen (event id to copies found in dest), or when violations were found.
func CheckCommitted(t testing.TB, ledger *Ledger, seen map[string]int, violations *Violations, records int, dest string) {
	t.Helper()
	missing := 0
	for id := range ledger.Committed {
		if seen[id] == 0 {
			missing++
			if missing <= 10 {
				t.Errorf("committed event %s is missing from %s", id, dest)
			}
		}
	}
	if missing > 0 || violations.n > 0 {
		t.Fatalf("%d committed events missing, %d other violations, among %d records for %d committed events",
			missing, violations.n, records, len(ledger.Committed))
	}
}
