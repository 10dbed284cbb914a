package cli_test

import (
	"encoding/json"
	"testing"

	"github.com/outboxrelay/relay/internal/bench"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
)

// TestBenchRuns keeps `relay bench` from rotting: a few seconds of each
// mode against the test cluster, checked through its JSON output.
func TestBenchRuns(t *testing.T) {
	t.Parallel()
	admin := pgtest.Cluster(t).URL()
	kafkaCluster := kafkatest.Start(t)
	for _, tc := range []struct {
		name string
		args []string
		base bool
	}{
		{"poll backlog", []string{"--source", "poll", "--backlog", "--events", "3000"}, true},
		{"cdc backlog", []string{"--source", "cdc", "--backlog", "--events", "3000"}, true},
		{"poll live", []string{"--source", "poll", "--events", "1000", "--rate", "2000", "--writers", "2"}, false},
		{"kafka sink live", []string{"--sink", "kafka", "--relay-args", "--kafka-brokers " + kafkaCluster.Addrs()[0] + " --kafka-create-topics",
			"--events", "1000", "--rate", "2000", "--writers", "2"}, false},
	} {
		r := relay(t, nil, append([]string{"bench", "--json", "--database-url", admin}, tc.args...)...)
		if r.code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.name, r.code, r.stderr)
		}
		var res bench.Result
		if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
			t.Fatalf("%s: output is not JSON: %v\n%s", tc.name, err, r.stdout)
		}
		if res.Published != res.Events || res.Written != res.Events || res.PublishRate <= 0 {
			t.Fatalf("%s: %+v: want every event written and published", tc.name, res)
		}
		if res.RSSPeakBytes <= 0 || res.CPUSeconds < 0 {
			t.Fatalf("%s: relay resources not measured: %+v", tc.name, res)
		}
		if tc.base && (res.Baseline == nil || res.Baseline.Rate <= 0 || res.Baseline.Ratio <= 0) {
			t.Fatalf("%s: baseline missing: %+v", tc.name, res.Baseline)
		}
		if !tc.base && res.LatencyP99 <= 0 {
			t.Fatalf("%s: no latency measured: %+v", tc.name, res)
		}
	}
}
