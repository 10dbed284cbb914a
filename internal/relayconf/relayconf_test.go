package relayconf

import (
	"errors"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/broker"
)

func TestParse(t *testing.T) {
	f, err := Parse("relay.yaml", []byte(`
batch-size: 20
listener-super-users: [User:a, User:b]
topic-defaults:
  retention.ms: 24h
  segment.bytes: 4096
topics:
  orders:
    partitions: 12
    cleanup.policy: compact, delete
    min.compaction.lag.ms: 90s
    delete.retention.ms: 1000
    allow-repartition: true
  empty:
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Flags) != 2 || f.Flags[0] != (Setting{"batch-size", "20", 2}) || f.Flags[1].Value != "User:a,User:b" {
		t.Fatalf("flags: %+v", f.Flags)
	}
	if f.Defaults.RetentionMs != 86_400_000 || f.Defaults.SegmentBytes != 4096 {
		t.Fatalf("defaults: %+v", f.Defaults)
	}
	if len(f.Topics) != 2 {
		t.Fatalf("topics: %+v", f.Topics)
	}
	o := f.Topics[0]
	want := broker.TopicConfig{Partitions: 12, CleanupPolicy: broker.CleanupDeleteCompact, MinCompactionLagMs: 90_000, DeleteRetentionMs: 1000}
	if o.Name != "orders" || o.Line != 8 || o.PartitionsLine != 9 || !o.AllowRepartition || o.Config != want {
		t.Fatalf("orders: %+v", o)
	}
	if e := f.Topics[1]; e.Name != "empty" || e.Config != (broker.TopicConfig{}) {
		t.Fatalf("empty: %+v", e)
	}
	if f, err := Parse("relay.yaml", nil); err != nil || len(f.Flags)+len(f.Topics) != 0 {
		t.Fatalf("an empty file: %+v, %v", f, err)
	}
}

func TestParseRefusesWithTheLine(t *testing.T) {
	cases := []struct{ file, want string }{
		{"a: 1\na: 2\n", "relay.yaml:2: a is set twice (first on line 1)"},
		{"topics:\n  bad/name:\n", "relay.yaml:2: topic \"bad/name\""},
		{"topics:\n  t:\n    retention.ms: soon\n", "relay.yaml:3: broker: invalid configuration: retention.ms=\"soon\""},
		{"topics:\n  t:\n    partitions: 0\n", "relay.yaml:3: partitions \"0\""},
		{"topics:\n  t:\n    cleanup.policy: archive\n", "relay.yaml:3: broker: invalid configuration: cleanup.policy \"archive\""},
		{"topics:\n  t:\n    flush.ms: 1\n", "relay.yaml:3: unknown topic config \"flush.ms\""},
		{"topic-defaults:\n  partitions: 3\n", "relay.yaml:2: partitions of topics created on first use"},
		{"topics:\n  t:\n    segment.bytes: 10\n", "relay.yaml:2: topic t: broker: invalid configuration"},
		{"log-level: {a: b}\n", "relay.yaml:1: log-level: a value or a list"},
		{"- a\n- b\n", "relay.yaml:1: the file must be a mapping"},
		{"a: [\n", "relay.yaml: "},
		{"a: 1\n---\nb: 2\n", "relay.yaml:2: a second YAML document"},
		{"topics:\n  t:\n    cloudevents: json\n", "relay.yaml:3: CloudEvents mode \"json\": must be off, binary or structured"},
		{"topics:\n  t:\n    cloudevents: [binary]\n", "relay.yaml:3: cloudevents: off, binary or structured"},
		{"topic-defaults:\n  cloudevents: binary\n", "relay.yaml:2: cloudevents is set per topic"},
	}
	for _, c := range cases {
		_, err := Parse("relay.yaml", []byte(c.file))
		var fe *Error
		if err == nil || !errors.As(err, &fe) || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: %v; want an error starting %q", c.file, err, c.want)
		}
	}
}

// TestParseCloudEvents: a topic's cloudevents key is its CloudEvents
// mode, not a broker config.
func TestParseCloudEvents(t *testing.T) {
	f, err := Parse("relay.yaml", []byte("topics:\n  a:\n    cloudevents: off\n    partitions: 2\n  b:\n    cloudevents: structured\n  c:\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, tp := range f.Topics {
		got[tp.Name] = tp.CloudEvents
	}
	if got["a"] != "off" || got["b"] != "structured" || got["c"] != "" || f.Topics[0].Config.Partitions != 2 {
		t.Errorf("topics %+v", f.Topics)
	}
}

// FuzzParse: no input makes Parse panic, and a file it accepts parses
// the same again.
func FuzzParse(f *testing.F) {
	f.Add([]byte("batch-size: 20\ntopics:\n  orders:\n    partitions: 3\n    retention.ms: 1h\n"))
	f.Add([]byte("topic-defaults:\n  cleanup.policy: compact,delete\n"))
	f.Add([]byte("a: [1, 2]\n---\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := Parse("f.yaml", data)
		if err != nil {
			return
		}
		b, err := Parse("f.yaml", data)
		if err != nil || len(a.Flags) != len(b.Flags) || len(a.Topics) != len(b.Topics) {
			t.Fatalf("parsed differently the second time: %v", err)
		}
	})
}
