package e2e

import (
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxrelay/relay/internal/bench"
)

// LatencyQuantile reads the relay's publish-latency histogram (from an
// event's INSERT to its durable acknowledgement) at addr and returns its q
// quantile and the number of events it counts.
func LatencyQuantile(t testing.TB, addr string, q float64) (time.Duration, uint64) {
	t.Helper()
	resp := scrape(t, addr)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing metrics: %v", err)
	}
	f := families["relay_publish_latency_seconds"]
	if f == nil || len(f.Metric) == 0 {
		t.Fatal("no publish latency histogram")
	}
	h := f.Metric[0].GetHistogram()
	return bench.Quantile(h, q), h.GetSampleCount()
}
