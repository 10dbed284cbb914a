package kafka

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
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
