package devcli_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/outboxrelay/relay/internal/bench"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testbin"
)

func TestMain(m *testing.M) { pgtest.Main(m, testbin.Cleanup) }

// TestBenchRuns keeps `relay-dev bench` from rotting: a few seconds of each
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
		{"cdc backlog, two runs", []string{"--source", "cdc", "--backlog", "--events", "2000", "--runs", "2"}, true},
		{"poll live", []string{"--source", "poll", "--events", "1000", "--rate", "2000", "--writers", "2"}, false},
		{"kafka sink live", []string{"--sink", "kafka", "--relay-args", "--kafka-brokers " + kafkaCluster.Addrs()[0] + " --kafka-create-topics",
			"--events", "1000", "--rate", "2000", "--writers", "2"}, false},
		{"kafka sink live, in-process cluster", []string{"--sink", "kafka", "--source", "cdc", "--events", "1000", "--rate", "2000", "--writers", "2"}, false},
	} {
		r, err := testbin.Run(context.Background(), testbin.RelayDev(t), nil, append([]string{"bench", "--json", "--database-url", admin}, tc.args...)...)
		if err != nil || r.Code != 0 {
			t.Fatalf("%s: %v, exit %d: %s", tc.name, err, r.Code, r.Stderr)
		}
		var results []bench.Result
		if slices.Contains(tc.args, "--runs") {
			if err := json.Unmarshal([]byte(r.Stdout), &results); err != nil || len(results) != 2 {
				t.Fatalf("%s: output is not a JSON array of 2 runs: %v\n%s", tc.name, err, r.Stdout)
			}
		} else {
			var res bench.Result
			if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
				t.Fatalf("%s: output is not JSON: %v\n%s", tc.name, err, r.Stdout)
			}
			results = append(results, res)
		}
		for _, res := range results {
			checkBenchResult(t, tc.name, tc.base, res)
		}
	}
}

func checkBenchResult(t *testing.T, name string, base bool, res bench.Result) {
	t.Helper()
	if res.Published != res.Events || res.Written != res.Events || res.PublishRate <= 0 {
		t.Fatalf("%s: %+v: want every event written and published", name, res)
	}
	if res.RSSPeakBytes <= 0 || res.CPUSeconds < 0 {
		t.Fatalf("%s: relay resources not measured: %+v", name, res)
	}
	if base && (res.Baseline == nil || res.Baseline.Rate <= 0 || res.Baseline.Ratio <= 0) {
		t.Fatalf("%s: baseline missing: %+v", name, res.Baseline)
	}
	if !base && res.LatencyP99 <= 0 {
		t.Fatalf("%s: no latency measured: %+v", name, res)
	}
	if res.Sink == "kafka" && !base && (res.Arrived != res.Events || res.ArrivalP99 <= 0 || res.ArrivalFrom == "") {
		t.Fatalf("%s: arrival in the cluster not measured for every event: %+v", name, res)
	}
}

// TestBenchSchemaValidation keeps `relay-dev bench --schema-validation`
// from rotting: both formats drained with validation off and on.
func TestBenchSchemaValidation(t *testing.T) {
	admin := pgtest.Cluster(t).URL()
	r, err := testbin.Run(context.Background(), testbin.RelayDev(t), nil, "bench", "--json", "--database-url", admin, "--backlog", "--schema-validation", "--events", "2000")
	if err != nil || r.Code != 0 {
		t.Fatalf("%v, exit %d: %s", err, r.Code, r.Stderr)
	}
	var res bench.Result
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, r.Stdout)
	}
	if res.Schema == nil || len(res.Schema.Formats) != 2 || res.Published != 4*2*2000 {
		t.Fatalf("want JSON and Avro, each drained twice off and twice on, 2000 events each: %+v", res)
	}
	for _, f := range res.Schema.Formats {
		if f.OffRate <= 0 || f.OnRate <= 0 || f.Ratio <= 0 || f.OnCPU <= 0 {
			t.Fatalf("%s: not measured: %+v", f.Format, f)
		}
	}
}
