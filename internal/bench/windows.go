package bench

import (
	"context"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/outboxrelay/relay/internal/procstat"
)

// Window is one interval of a live run (Config.Window): the relay's
// latency percentiles over the events it acknowledged in that interval
// alone, and what PostgreSQL did meanwhile, so that a tail can be dated
// and set beside checkpoints, autovacuum and WAL volume.
type Window struct {
	// End is the window's end, from the start of the writers.
	End     time.Duration `json:"end_ns"`
	Events  uint64        `json:"events"`
	P50     time.Duration `json:"p50_ns"`
	P99     time.Duration `json:"p99_ns"`
	WALByte int64         `json:"wal_bytes"`
	// Checkpoints and Autovacuums started in the window (pg_stat_bgwriter,
	// pg_stat_user_tables of the outbox), DeadRows is the outbox's dead
	// tuples at its end.
	Checkpoints int64 `json:"checkpoints"`
	Autovacuums int64 `json:"autovacuums"`
	DeadRows    int64 `json:"dead_rows"`
	RSSBytes    int64 `json:"relay_rss_bytes"`
}

type pgCounters struct {
	lsn, checkpoints, autovacuums, dead int64
}

func (e *env) pgCounters(ctx context.Context) (pgCounters, error) {
	var c pgCounters
	err := e.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn() - '0/0'::pg_lsn,
    (SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter),
    coalesce((SELECT autovacuum_count + autoanalyze_count FROM pg_stat_user_tables WHERE schemaname = 'outbox' AND relname = 'events'), 0),
    coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE schemaname = 'outbox' AND relname = 'events'), 0)`).
		Scan(&c.lsn, &c.checkpoints, &c.autovacuums, &c.dead)
	return c, err
}

// histogram reads the relay's commit latency histogram (or, for a reader
// without commit times, its publish latency histogram).
func (p *relayProc) histogram() (*dto.Histogram, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{"relay_commit_latency_seconds", "relay_publish_latency_seconds"} {
		if f := families[name]; f != nil && len(f.Metric) > 0 && f.Metric[0].GetHistogram().GetSampleCount() > 0 {
			return f.Metric[0].GetHistogram(), nil
		}
	}
	return &dto.Histogram{}, nil
}

// minus is h less an earlier reading of the same histogram.
func minus(h, prev *dto.Histogram) *dto.Histogram {
	d := &dto.Histogram{SampleCount: new(uint64)}
	*d.SampleCount = h.GetSampleCount() - prev.GetSampleCount()
	before := map[float64]uint64{}
	for _, b := range prev.GetBucket() {
		before[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	for _, b := range h.GetBucket() {
		n := b.GetCumulativeCount() - before[b.GetUpperBound()]
		ub := b.GetUpperBound()
		d.Bucket = append(d.Bucket, &dto.Bucket{UpperBound: &ub, CumulativeCount: &n})
	}
	return d
}

// windowEnd is what a Window compares at its start and its end: the
// relay's latency histogram and Postgres's counters.
type windowEnd struct {
	latency *dto.Histogram
	pg      pgCounters
}

func (e *env) readWindowEnd(ctx context.Context, p *relayProc) (windowEnd, error) {
	h, err := p.histogram()
	if err != nil {
		return windowEnd{}, err
	}
	c, err := e.pgCounters(ctx)
	return windowEnd{latency: h, pg: c}, err
}

// watchWindows logs a Window every Config.Window until ctx ends, and
// returns them all.
func (e *env) watchWindows(ctx context.Context, p *relayProc, start time.Time) <-chan []Window {
	out := make(chan []Window, 1)
	go func() {
		var ws []Window
		defer func() { out <- ws }()
		prev, err := e.readWindowEnd(ctx, p)
		if err != nil {
			return
		}
		t := time.NewTicker(e.cfg.Window)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cur, err := e.readWindowEnd(ctx, p)
			if err != nil {
				return
			}
			d := minus(cur.latency, prev.latency)
			rss, _ := procstat.RSS(p.cmd.Process.Pid)
			w := Window{End: time.Since(start), Events: d.GetSampleCount(), P50: Quantile(d, 0.5), P99: Quantile(d, 0.99),
				WALByte: cur.pg.lsn - prev.pg.lsn, Checkpoints: cur.pg.checkpoints - prev.pg.checkpoints,
				Autovacuums: cur.pg.autovacuums - prev.pg.autovacuums, DeadRows: cur.pg.dead, RSSBytes: rss}
			ws = append(ws, w)
			e.cfg.Logger.Info("window", "end", w.End.Round(time.Second), "events", w.Events,
				"p50", w.P50.Round(10*time.Microsecond), "p99", w.P99.Round(10*time.Microsecond),
				"wal_bytes_per_event", safeDiv(w.WALByte, int64(w.Events)), "checkpoints", w.Checkpoints,
				"autovacuums", w.Autovacuums, "dead_rows", w.DeadRows, "relay_rss_mib", rss>>20)
			prev = cur
		}
	}()
	return out
}

func safeDiv(a, b int64) int64 {
	if b == 0 {
		return 0
	}
	return a / b
}
