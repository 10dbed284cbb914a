package kafka

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outboxrelay/relay/relay"
)

func TestMarkerRoundTrip(t *testing.T) {
	ds := []digest{digestOf(relay.Message{Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte("a")}}}), {1, 2, 3}}
	seq, got, ok, err := decodeMarker(encodeMarker(42, ds))
	if err != nil || !ok || seq != 42 || len(got) != 2 || got[0] != ds[0] || got[1] != ds[1] {
		t.Fatalf("decode = %d %v %v %v", seq, got, ok, err)
	}
	if _, _, ok, err := decodeMarker(encodeStart()); ok || err != nil {
		t.Fatalf("a start record decoded as a marker: %v %v", ok, err)
	}
	if _, _, _, err := decodeMarker(encodeMarker(1, ds)[:30]); err == nil {
		t.Fatal("a truncated marker decoded")
	}
}

func TestDigestUsesEventID(t *testing.T) {
	a := relay.Message{Topic: "t", Value: []byte("1"), Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte("e")}}}
	b := relay.Message{Topic: "u", Value: []byte("2"), Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte("e")}}}
	if digestOf(a) != digestOf(b) {
		t.Fatal("same event id, different digests")
	}
	c := relay.Message{Topic: "t", Value: []byte("1"), Timestamp: time.Unix(1, 0)}
	d := relay.Message{Topic: "t", Value: []byte("2"), Timestamp: time.Unix(1, 0)}
	if digestOf(c) == digestOf(d) {
		t.Fatal("messages without ids but different contents share a digest")
	}
}

func TestStateRoundTrip(t *testing.T) {
	st := &txnState{V: 1, TransactionalID: "x", ProgressTopic: "p", Offset: 7, Seq: 3, pending: map[digest]struct{}{{9}: {}}}
	got, err := decodeState(st.encode(), "x", "p")
	if err != nil || got == nil || got.Offset != 7 || len(got.pending) != 1 {
		t.Fatalf("decode = %+v, %v", got, err)
	}
	if got, _ := decodeState(st.encode(), "other", "p"); got != nil {
		t.Fatal("a state of another transactional id was taken")
	}
	if got, err := decodeState([]byte(`{"producer_id":3}`), "x", "p"); got != nil || err != nil {
		t.Fatalf("the embedded sink's state: %v %v", got, err)
	}
	if _, err := decodeState([]byte("junk"), "x", "p"); err == nil {
		t.Fatal("junk decoded")
	}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Brokers: []string{"localhost:9092"}}
	for name, c := range map[string]Config{
		"no brokers":      {},
		"bad broker":      {Brokers: []string{"localhost"}},
		"compression":     {Brokers: ok.Brokers, Compression: "brotli"},
		"sasl mechanism":  {Brokers: ok.Brokers, SASL: SASLConfig{Mechanism: "GSSAPI", User: "u"}},
		"sasl no user":    {Brokers: ok.Brokers, SASL: SASLConfig{Mechanism: SASLPlain}},
		"user no mech":    {Brokers: ok.Brokers, SASL: SASLConfig{User: "u", Password: "p"}},
		"cert no key":     {Brokers: ok.Brokers, TLS: TLSConfig{CertFile: "c.pem"}},
		"batch too small": {Brokers: ok.Brokers, BatchMaxBytes: 100},
		"progress topic":  {Brokers: ok.Brokers, ProgressTopic: "bad topic"},
		"partitions":      {Brokers: ok.Brokers, Partitions: -2},
	} {
		if err := c.WithDefaults().Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if err := ok.WithDefaults().Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Brokers: ok.Brokers, TLS: TLSConfig{CAFile: "/nonexistent.pem"}}); err == nil {
		t.Fatal("a missing CA file passed New")
	}
}

func TestPasswordNotLogged(t *testing.T) {
	c := SASLConfig{Mechanism: SASLPlain, User: "u", Password: "hunter2"}
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "sasl", c)
	if out := buf.String() + fmt.Sprint(c) + fmt.Sprintf("%v %+v %s", c, c, c); strings.Contains(out, "hunter2") {
		t.Fatalf("password in %q", out)
	}
}

func TestRecordBatchSizeBoundsTheClient(t *testing.T) {
	m := relay.Message{Topic: "t", Key: []byte("k"), Value: bytes.Repeat([]byte("v"), 1000),
		Headers: []relay.Header{{Key: "a", Value: []byte("b")}}}
	if n := recordBatchSize(m); n < 1000+61 || n > 1000+61+40 {
		t.Fatalf("recordBatchSize = %d", n)
	}
}

func TestDigestTellsReplaysApart(t *testing.T) {
	orig := relay.Message{Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte("e")}}}
	replay := relay.Message{Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte("e")}, {Key: relay.HeaderReplay, Value: []byte("7")}}}
	other := relay.Message{Headers: []relay.Header{{Key: relay.HeaderEventID, Value: []byte("e")}, {Key: relay.HeaderReplay, Value: []byte("8")}}}
	if digestOf(orig) == digestOf(replay) || digestOf(replay) == digestOf(other) {
		t.Fatal("a replay shares its digest with the original or with another replay")
	}
	// A first publication hashes as before replays had an identity, so
	// markers and saved states written by earlier versions still match.
	sum := sha256.Sum256([]byte("\x01e"))
	if d := digestOf(orig); !bytes.Equal(d[:], sum[:16]) {
		t.Fatal("the digest of a first publication changed")
	}
	// The row's own headers cannot pose as the relay's: the last wins.
	forged := relay.Message{Headers: []relay.Header{{Key: relay.HeaderReplay, Value: []byte("7")}, {Key: relay.HeaderEventID, Value: []byte("e")}}}
	if digestOf(forged) != digestOf(replay) {
		t.Fatal("header order changed the identity")
	}
}

// fenceSwitch is a fence that fails once tripped.
type fenceSwitch struct{ tripped atomic.Bool }

func (f *fenceSwitch) check() error {
	if f.tripped.Load() {
		return fmt.Errorf("%w: test fence", relay.ErrNotLeader)
	}
	return nil
}

// TestFencedConnStopsABlockedWrite: a write blocked because the broker
// reads nothing goes on in slices after fresh fence checks; once the fence
// fails it stops with ErrNotLeader, the connection is reset, the broker
// receives not one byte more, and nothing can be dialled any longer.
func TestFencedConnStopsABlockedWrite(t *testing.T) {
	var fence fenceSwitch
	d := newFencedDialer(fence.check, time.Second, nil)
	client, broker := net.Pipe()
	c := &fencedConn{Conn: client, d: d}
	d.conns[c] = struct{}{}

	const read = 1000
	got := make(chan int, 1)
	go func() {
		n, _ := io.ReadFull(broker, make([]byte, read))
		got <- n
	}()
	written := make(chan error, 1)
	var n int
	go func() {
		var err error
		n, err = c.Write(make([]byte, 1<<20))
		written <- err
	}()
	if r := <-got; r != read {
		t.Fatalf("the broker read %d bytes", r)
	}
	fence.tripped.Store(true)
	err := <-written
	if !errors.Is(err, relay.ErrNotLeader) {
		t.Fatalf("the blocked write ended with %v, want ErrNotLeader", err)
	}
	if n != read {
		t.Fatalf("%d bytes written, the broker read %d", n, read)
	}
	if more, err := broker.Read(make([]byte, 10)); more != 0 || err == nil {
		t.Fatalf("the broker read %d more bytes (%v) after the fence failed", more, err)
	}
	if _, err := d.dial(context.Background(), "tcp", "127.0.0.1:1"); !errors.Is(err, relay.ErrNotLeader) {
		t.Fatalf("dial after the fence failed: %v", err)
	}
}

// TestFencedConnKeepsTheClientsDeadline: the client's write deadline ends
// a blocked write as on a bare connection, and the connection stays usable.
func TestFencedConnKeepsTheClientsDeadline(t *testing.T) {
	var fence fenceSwitch
	d := newFencedDialer(fence.check, time.Second, nil)
	client, broker := net.Pipe()
	defer broker.Close()
	c := &fencedConn{Conn: client, d: d}
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := c.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a write past the client's deadline: %v", err)
	}
	c.SetWriteDeadline(time.Time{})
	go io.ReadFull(broker, make([]byte, 3))
	if _, err := c.Write([]byte("abc")); err != nil {
		t.Fatalf("a write after the deadline was lifted: %v", err)
	}
}
