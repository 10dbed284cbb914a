package relayconf

import (
	"slices"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/broker/protocol"
)

func TestParseShareGroups(t *testing.T) {
	f, err := Parse("relay.yaml", []byte(`
share-groups:
  jobs:
    share.auto.offset.reset: earliest
    share.record.lock.duration.ms: 15s
    share.delivery.count.limit: 3
    share.partition.max.record.locks: 2000
    errors.deadletterqueue.topic.name: jobs.dlq
  quiet:
topics:
  jobs:
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.ShareGroups) != 2 || len(f.Topics) != 1 {
		t.Fatalf("share groups: %+v, topics %+v", f.ShareGroups, f.Topics)
	}
	g := f.ShareGroups[0]
	want := []protocol.ShareGroupConfig{
		{Name: "share.auto.offset.reset", Value: "earliest"},
		{Name: "share.record.lock.duration.ms", Value: "15000"},
		{Name: "share.delivery.count.limit", Value: "3"},
		{Name: "share.partition.max.record.locks", Value: "2000"},
		{Name: "errors.deadletterqueue.topic.name", Value: "jobs.dlq"},
	}
	if g.Name != "jobs" || g.Line != 3 || !slices.Equal(g.Configs, want) {
		t.Fatalf("jobs: %+v", g)
	}
	if q := f.ShareGroups[1]; q.Name != "quiet" || q.Line != 9 || len(q.Configs) != 0 {
		t.Fatalf("quiet: %+v", q)
	}
}

// TestParseShareGroupsRefusesWithTheLine: each mistake names its line,
// and a bad value gets the message IncrementalAlterConfigs would give.
func TestParseShareGroupsRefusesWithTheLine(t *testing.T) {
	cases := []struct{ file, want string }{
		{"share-groups: [jobs]\n", "relay.yaml:1: share-groups must map each share group id"},
		{"share-groups:\n  jobs: 3\n", "relay.yaml:2: share group jobs: a mapping of share group configs"},
		{"share-groups:\n  jobs:\n  jobs:\n", "relay.yaml:3: share group jobs is declared twice (first on line 2)"},
		{"share-groups:\n  jobs:\n    share.lock.ms: 1000\n", "relay.yaml:3: share group jobs: unknown share group config \"share.lock.ms\" (known: share.auto.offset.reset, "},
		{"share-groups:\n  jobs:\n    share.auto.offset.reset: newest\n", "relay.yaml:3: share group jobs: share.auto.offset.reset must be earliest or latest, not \"newest\""},
		{"share-groups:\n  jobs:\n    share.record.lock.duration.ms: 500\n", "relay.yaml:3: share group jobs: share.record.lock.duration.ms must be an integer in [1000, 3600000], not \"500\""},
		{"share-groups:\n  jobs:\n    share.record.lock.duration.ms: soon\n", "relay.yaml:3: share group jobs: share.record.lock.duration.ms must be an integer"},
		{"share-groups:\n  jobs:\n    share.delivery.count.limit: 11\n", "relay.yaml:3: share group jobs: share.delivery.count.limit must be an integer in [2, 10], not \"11\""},
		{"share-groups:\n  jobs:\n    share.partition.max.record.locks: 50\n", "relay.yaml:3: share group jobs: share.partition.max.record.locks must be an integer in [100, 10000]"},
		{"share-groups:\n  jobs:\n    errors.deadletterqueue.topic.name: bad/name\n", "relay.yaml:3: share group jobs: errors.deadletterqueue.topic.name: "},
		{"share-groups:\n  jobs:\n    share.delivery.count.limit: [3]\n", "relay.yaml:3: share group jobs: share.delivery.count.limit: a single value is expected"},
		{"share-groups:\n  jobs:\n    share.delivery.count.limit: 3\n    share.delivery.count.limit: 4\n", "relay.yaml:4: share.delivery.count.limit is set twice (first on line 3)"},
	}
	for _, c := range cases {
		_, err := Parse("relay.yaml", []byte(c.file))
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %s...", c.file, err, c.want)
		}
	}
}
