package devcli_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
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

// TestBenchBigTx keeps `relay-dev bench bigtx` from rotting: a
// transaction of 30,000 events at a logical_decoding_work_mem of 64 kB,
// streamed and spilled on the server, each published whole.
func TestBenchBigTx(t *testing.T) {
	t.Parallel()
	admin := pgtest.Cluster(t).URL()
	r, err := testbin.Run(context.Background(), testbin.RelayDev(t), nil, "bench", "bigtx", "--json", "--database-url", admin,
		"--events", "30000", "--logical-decoding-work-mem", "64kB")
	if err != nil || r.Code != 0 {
		t.Fatalf("%v, exit %d: %s", err, r.Code, r.Stderr)
	}
	var results []bench.BigTxResult
	if err := json.Unmarshal([]byte(r.Stdout), &results); err != nil || len(results) != 2 {
		t.Fatalf("output is not a JSON array of 2 runs: %v\n%s", err, r.Stdout)
	}
	for _, res := range results {
		if res.Records != 30000 || res.OutOfOrder != 0 || res.PublishSeconds <= 0 || res.RSSPeakBytes <= 0 {
			t.Fatalf("%+v: want 30,000 records in key order, timed, RSS measured", res)
		}
		// The relay's acknowledgements, deleting 1,000 rows each, are
		// large transactions too: they stream or spill as well.
		if res.Streaming && (res.StreamTxns < 1 || res.SpillTxns != 0) || !res.Streaming && (res.StreamTxns != 0 || res.SpillTxns < 1) {
			t.Fatalf("%+v: the server's statistics do not match the mode", res)
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

// TestBenchTracing keeps `relay-dev bench --tracing` from rotting: a
// backlog drained with the relay's tracing off, then on, the second
// exporting spans to the bench's receiver.
func TestBenchTracing(t *testing.T) {
	t.Parallel()
	admin := pgtest.Cluster(t).URL()
	r, err := testbin.Run(context.Background(), testbin.RelayDev(t), nil, "bench", "--json", "--database-url", admin, "--backlog", "--tracing", "--events", "2000")
	if err != nil || r.Code != 0 {
		t.Fatalf("%v, exit %d: %s", err, r.Code, r.Stderr)
	}
	var res []bench.Result
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("output is not a JSON array: %v\n%s", err, r.Stdout)
	}
	if len(res) != 2 || res[0].Mode != "backlog tracing off" || res[1].Mode != "backlog tracing on" {
		t.Fatalf("want a run with tracing off, then one on: %+v", res)
	}
	for _, x := range res {
		if x.Published != 2000 || x.PublishRate <= 0 || x.Baseline != nil {
			t.Fatalf("%s: want 2000 events published, a rate, no baseline: %+v", x.Mode, x)
		}
	}
	if res[0].OTLPExports != 0 || res[1].OTLPExports == 0 || res[1].OTLPBytes == 0 {
		t.Fatalf("span exports: off %d, on %d (%d bytes); want none, then some", res[0].OTLPExports, res[1].OTLPExports, res[1].OTLPBytes)
	}
}

// TestBenchShapes runs a short version of each scale shape of `relay-dev
// bench` (issue 24) and checks what it reports: many topics and
// partitions read back by one consumer and by a group of three, mixed
// payload sizes up to 1 MiB, ten million keys, and the broker-only open
// after a clean stop, after a SIGKILL, and with a compaction pass.
func TestBenchShapes(t *testing.T) {
	t.Parallel()
	admin := pgtest.Cluster(t).URL()
	bin := testbin.RelayDev(t)
	relayRun := func(t *testing.T, args ...string) bench.Result {
		t.Helper()
		r, err := testbin.Run(context.Background(), bin, nil, append([]string{"bench", "--json", "--database-url", admin}, args...)...)
		if err != nil || r.Code != 0 {
			t.Fatalf("%v: %v, exit %d: %s", args, err, r.Code, r.Stderr)
		}
		var res bench.Result
		if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
			t.Fatalf("%v: output is not JSON: %v\n%s", args, err, r.Stdout)
		}
		if res.Published != res.Events || res.Written != res.Events || res.OpenFiles <= 0 {
			t.Fatalf("%v: want every event written and published and the relay's open files counted: %+v", args, res)
		}
		return res
	}
	t.Run("topics and partitions, one consumer", func(t *testing.T) {
		res := relayRun(t, "--backlog", "--baseline=false", "--events", "2000", "--topics", "20", "--partitions", "4", "--consumers", "1")
		if res.Topics != 20 || res.Partitions != 4 || res.Consume == nil || res.Consume.Records != 2000 || res.Consume.Group || res.Consume.Rate <= 0 {
			t.Fatalf("want 2000 events over 20 topics of 4 partitions read back by one consumer: %+v %+v", res, res.Consume)
		}
		if res.OpenFiles < 80 {
			t.Fatalf("the relay held %d files open for 80 partitions, want one per partition at least", res.OpenFiles)
		}
		bounded := relayRun(t, "--backlog", "--baseline=false", "--events", "2000", "--topics", "20", "--partitions", "4", "--consumers", "1",
			"--relay-args", "--max-open-files 4")
		if bounded.Consume == nil || bounded.Consume.Records != 2000 || bounded.OpenFiles >= res.OpenFiles-50 {
			t.Fatalf("with --max-open-files 4 the relay held %d files open (%d without), want at least 50 fewer, and every event read back: %+v",
				bounded.OpenFiles, res.OpenFiles, bounded.Consume)
		}
	})
	t.Run("mixed payloads, a group of three", func(t *testing.T) {
		res := relayRun(t, "--backlog", "--baseline=false", "--events", "100", "--payload-mix", "--topics", "3", "--consumers", "3",
			"--idle-rss", "1s", "--restarts", "2")
		if res.PayloadBytes < 50_000 || res.Consume == nil || res.Consume.Records != 100 || !res.Consume.Group || res.Consume.Bytes < int64(100*res.PayloadBytes) {
			t.Fatalf("want 100 payloads of mean size above 50 KB read back by a group of 3: %+v %+v", res, res.Consume)
		}
		if res.CPUPerEvent <= 0 || res.IdleRSSBytes <= 0 || len(res.ReadySeconds) != 2 || res.ReadySeconds[0] <= 0 || res.ReadySeconds[1] <= 0 {
			t.Fatalf("want CPU per event, the idle RSS and two start-to-ready times: %+v", res)
		}
	})
	t.Run("ten million keys, live", func(t *testing.T) {
		res := relayRun(t, "--events", "500", "--rate", "2000", "--writers", "2", "--keys", "10000000", "--payload-bytes", "16384")
		if res.LatencyP99 <= 0 || res.PayloadBytes != 16384 || res.CPUPerEvent <= 0 {
			t.Fatalf("no latency or CPU per event measured: %+v", res)
		}
	})
	t.Run("bad shapes are refused", func(t *testing.T) {
		for _, args := range [][]string{{"--consumers", "1"}, {"--keys", "10000001"}, {"--partitions", "10001"}, {"--restarts", "1"}, {"--idle-rss", "1s"}} {
			r, err := testbin.Run(context.Background(), bin, nil, append([]string{"bench", "--database-url", admin}, args...)...)
			if err != nil || r.Code == 0 || !strings.Contains(r.Stderr, args[0]) {
				t.Fatalf("%v: want a refusal naming %s: %v, exit %d: %s", args, args[0], err, r.Code, r.Stderr)
			}
		}
	})
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"broker, clean stop", []string{"--log-bytes", "4MiB", "--partitions", "4", "--topics", "2"}},
		{"broker, SIGKILL, cold", []string{"--log-bytes", "4MiB", "--partitions", "4", "--kill", "--cold"}},
		{"broker, compaction", []string{"--log-bytes", "6MiB", "--partitions", "1", "--compact", "--keys", "5000", "--segment-bytes", "1MiB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := testbin.Run(context.Background(), bin, nil, append([]string{"bench", "broker", "--json"}, tc.args...)...)
			if err != nil || r.Code != 0 {
				t.Fatalf("%v, exit %d: %s", err, r.Code, r.Stderr)
			}
			var res bench.BrokerResult
			if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, r.Stdout)
			}
			if res.LogBytes < 4<<20 || res.Records <= 0 || res.OpenSeconds <= 0 || res.OpenFiles <= 0 || res.OpenRSSBytes <= 0 {
				t.Fatalf("not measured: %+v", res)
			}
			if slices.Contains(tc.args, "--kill") != (res.Stop == "SIGKILL") {
				t.Fatalf("stop %q for %v", res.Stop, tc.args)
			}
			if slices.Contains(tc.args, "--compact") && (res.CompactSeconds <= 0 || res.CompactPeakRSSBytes <= 0 || res.BytesAfterCompact <= 0 || res.BytesAfterCompact >= res.LogBytes) {
				t.Fatalf("compaction not measured or it removed nothing: %+v", res)
			}
		})
	}
}

// TestBenchWindows: a live run with --window reports each interval's
// latencies over the events acknowledged in it, and the WAL written.
func TestBenchWindows(t *testing.T) {
	t.Parallel()
	admin := pgtest.Cluster(t).URL()
	r, err := testbin.Run(context.Background(), testbin.RelayDev(t), nil, "bench", "--json", "--database-url", admin,
		"--source", "cdc", "--events", "3000", "--rate", "1000", "--writers", "2", "--window", "500ms")
	if err != nil || r.Code != 0 {
		t.Fatalf("%v, exit %d: %s", err, r.Code, r.Stderr)
	}
	var res bench.Result
	if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, r.Stdout)
	}
	checkBenchResult(t, "cdc live with windows", false, res)
	if len(res.Windows) < 3 {
		t.Fatalf("%d windows in a 3 s run of 500 ms windows: %+v", len(res.Windows), res.Windows)
	}
	var events uint64
	for i, w := range res.Windows {
		events += w.Events
		if w.Events > 0 && (w.P50 <= 0 || w.P99 < w.P50 || w.WALByte <= 0) {
			t.Errorf("window %d: %+v", i, w)
		}
		if i > 0 && w.End <= res.Windows[i-1].End {
			t.Errorf("window %d ends at %v, before the previous one", i, w.End)
		}
	}
	if events == 0 || events > uint64(res.Published) {
		t.Errorf("the windows hold %d events of %d published", events, res.Published)
	}
	if !strings.Contains(r.Stderr, "msg=window") {
		t.Errorf("no window in the log:\n%s", r.Stderr)
	}
}
