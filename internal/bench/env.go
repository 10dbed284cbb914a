package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/internal/procstat"
	"github.com/outboxrelay/relay/migrations"
)

type env struct {
	cfg      Config
	cluster  *pgcluster.Cluster
	url      string
	dbName   string
	adminURL string
	pool     *pgxpool.Pool
	dir      string
	// kfake is the in-process Kafka cluster of a --sink kafka run given
	// no brokers; brokers are the cluster's addresses either way.
	kfake   *kfake.Cluster
	brokers []string
	// relayEnv is added to the relay's environment (tracing.go).
	relayEnv []string
}

func newEnv(ctx context.Context, cfg Config) (*env, error) {
	e := &env{cfg: cfg}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	var err error
	if e.dir, err = os.MkdirTemp("", "relay-bench-*"); err != nil {
		return nil, err
	}
	if cfg.Sink == "kafka" {
		if e.brokers = brokersArg(cfg.RelayArgs); e.brokers == nil {
			var addr string
			if e.kfake, addr, err = startKfake(); err != nil {
				return nil, err
			}
			e.brokers = []string{addr}
			e.cfg.RelayArgs = append([]string{"--kafka-brokers", addr, "--kafka-create-topics"}, cfg.RelayArgs...)
			cfg.Logger.Info("started an in-process Kafka cluster (kfake)", "addr", addr)
		}
	}
	if cfg.DatabaseURL == "" {
		cfg.Logger.Info("starting a throwaway PostgreSQL")
		// Commit timestamps let the arrival consumer measure from each
		// transaction's commit, as the WAL reader does; the poll reader
		// orders by them when they are on, so they are its own case.
		opts := pgcluster.Options{Durable: true}
		if cfg.Source == "cdc" || cfg.CommitTimestamps {
			opts.Settings = map[string]string{"track_commit_timestamp": "on"}
		}
		if e.cluster, err = pgcluster.Start(ctx, opts); err != nil {
			return nil, err
		}
		e.adminURL = e.cluster.URL()
	} else {
		e.adminURL = cfg.DatabaseURL
	}
	admin, err := pgconfig.Connect(ctx, e.adminURL)
	if err != nil {
		return nil, err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	e.dbName = fmt.Sprintf("relay_bench_%d", time.Now().UnixNano())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+e.dbName); err != nil {
		return nil, fmt.Errorf("creating the bench database: %w", err)
	}
	e.url = replaceDatabase(e.adminURL, e.dbName)
	poolCfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		return nil, fmt.Errorf("the bench database's URL: %s", pgconfig.Scrub(err, e.url))
	}
	// One connection per writer, so that --writers are as concurrent as
	// they say (the pool's default is four), and a few for the bench.
	poolCfg.MaxConns = int32(cfg.Writers + 4)
	if e.pool, err = pgxpool.NewWithConfig(ctx, poolCfg); err != nil {
		return nil, fmt.Errorf("connecting to the bench database: %s", pgconfig.Scrub(err, e.url))
	}
	m, err := migrations.New(migrations.DefaultSchema)
	if err != nil {
		return nil, err
	}
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	_, err = m.Up(ctx, conn.Conn(), false)
	conn.Release()
	if err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

// replaceDatabase points a URL or key=value connection string at another
// database.
func replaceDatabase(connString, db string) string {
	if strings.HasPrefix(connString, "postgres://") || strings.HasPrefix(connString, "postgresql://") {
		u, err := url.Parse(connString)
		if err == nil {
			u.Path = "/" + db
			return u.String()
		}
	}
	return connString + " dbname=" + db
}

func (e *env) close() {
	if e.pool != nil {
		e.pool.Close()
	}
	if e.dbName != "" && e.cluster == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if admin, err := pgconfig.Connect(ctx, e.adminURL); err == nil {
			admin.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1 AND NOT active`, e.dbName)
			admin.Exec(ctx, "DROP DATABASE IF EXISTS "+e.dbName+" WITH (FORCE)")
			admin.Close(ctx)
		}
	}
	if e.cluster != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		e.cluster.Stop(ctx)
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
	if e.kfake != nil {
		e.kfake.Close()
	}
}

// relayProc is the relay under test.
type relayProc struct {
	cmd *exec.Cmd
	// maxFiles is the most open file descriptors seen.
	maxFiles atomic.Int64
	addr     string
	done     chan struct{}
	logPath  string
	// started is just before exec, ready the first 200 of /readyz.
	started, ready time.Time
	// cpuMark is the relay's CPU seconds where a live run's writers
	// started: CPU per event counts from there.
	cpuMark float64
}

func (e *env) startRelay(ctx context.Context) (*relayProc, error) {
	return e.startRelayWith(ctx)
}

// startRelayWith starts the relay with extra flags after the configured
// ones.
func (e *env) startRelayWith(ctx context.Context, extra ...string) (*relayProc, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(e.dir, fmt.Sprintf("relay-%d.log", time.Now().UnixNano()))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	args := []string{"run", "--database-url", e.url, "--data-dir", filepath.Join(e.dir, "data"),
		"--source", e.cfg.Source, "--sink", e.cfg.Sink, "--kafka-addr", "", "--http-addr", addr, "--log-level", "warn"}
	if e.cfg.Partitions > 0 {
		args = append(args, "--partitions", strconv.Itoa(e.cfg.Partitions))
	}
	args = append(args, append(e.cfg.RelayArgs, extra...)...)
	cmd := exec.Command(e.cfg.RelayBinary, args...)
	if e.relayEnv != nil {
		cmd.Env = append(os.Environ(), e.relayEnv...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group: a terminal's SIGINT reaches only the bench,
	// which then stops the relay itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &relayProc{cmd: cmd, addr: addr, done: make(chan struct{}), logPath: logPath, started: time.Now()}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the relay: %w", err)
	}
	go func() { cmd.Wait(); close(p.done) }()
	go p.sampleFiles()
	deadline := time.Now().Add(time.Minute)
	for {
		if ready(addr) {
			p.ready = time.Now()
			e.cfg.Logger.Info("the relay is ready", "after", p.ready.Sub(p.started).Round(time.Millisecond))
			return p, nil
		}
		select {
		case <-p.done:
			out, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("the relay exited at start:\n%s", out)
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, errors.New("the relay did not become ready within a minute")
		}
	}
}

// freeAddr is a loopback address no one listened on a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func ready(addr string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// sampleFiles notes the relay's open file descriptors every second until
// it exits. Counting them lists /proc/PID/fd, about 13 ms of CPU with the
// 8,000 of a relay over 1,000 topics: every 100 ms, as it was, the count
// took a sixth of a core from the relay and PostgreSQL on a two-core
// machine, in the many-topic runs only. The relay holds its descriptors
// from its start (its partitions' active segments), so a sample a second
// and one at the end see the peak.
func (p *relayProc) sampleFiles() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		p.noteFiles()
		select {
		case <-p.done:
			return
		case <-t.C:
		}
	}
}

func (p *relayProc) noteFiles() {
	if n, err := procstat.OpenFiles(p.cmd.Process.Pid); err == nil && int64(n) > p.maxFiles.Load() {
		p.maxFiles.Store(int64(n))
	}
}

// usage reads the relay's peak RSS and CPU time from /proc; call it while
// the process is alive.
func (p *relayProc) usage() (rss int64, cpu float64) {
	pid := p.cmd.Process.Pid
	rss, _ = procstat.PeakRSS(pid)
	cpu, _ = procstat.CPUSeconds(pid)
	return rss, cpu
}

// stop asks the relay to stop and waits; it kills it after 30 s.
func (p *relayProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// latency reads the relay's latency histogram and max gauge: from the
// commit of each event's transaction where the reader knows commit times
// (cdc), else from its created_at (the INSERT, before the commit).
func (p *relayProc) latency() (from string, p50, p90, p99, maxLatency time.Duration, err error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + p.addr + "/metrics")
	if err != nil {
		return "", 0, 0, 0, 0, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return "", 0, 0, 0, 0, err
	}
	from, hist, gauge := "commit", "relay_commit_latency_seconds", "relay_commit_latency_max_seconds"
	if f := families[hist]; f == nil || len(f.Metric) == 0 || f.Metric[0].GetHistogram().GetSampleCount() == 0 {
		from, hist, gauge = "insert", "relay_publish_latency_seconds", "relay_publish_latency_max_seconds"
	}
	if f := families[gauge]; f != nil && len(f.Metric) > 0 {
		maxLatency = seconds(f.Metric[0].GetGauge().GetValue())
	}
	f := families[hist]
	if f == nil || len(f.Metric) == 0 {
		return "", 0, 0, 0, maxLatency, errors.New("no latency histogram")
	}
	h := f.Metric[0].GetHistogram()
	return from, Quantile(h, 0.5), Quantile(h, 0.9), Quantile(h, 0.99), maxLatency, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Quantile interpolates linearly within the bucket of h holding q.
func Quantile(h *dto.Histogram, q float64) time.Duration {
	total := float64(h.GetSampleCount())
	if total == 0 {
		return 0
	}
	buckets := h.GetBucket()
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].GetUpperBound() < buckets[j].GetUpperBound() })
	rank := q * total
	lower, below := 0.0, 0.0
	for _, b := range buckets {
		count := float64(b.GetCumulativeCount())
		if count >= rank {
			if math.IsInf(b.GetUpperBound(), 1) {
				return seconds(lower)
			}
			inBucket := count - below
			frac := 1.0
			if inBucket > 0 {
				frac = (rank - below) / inBucket
			}
			return seconds(lower + (b.GetUpperBound()-lower)*frac)
		}
		lower, below = b.GetUpperBound(), count
	}
	return seconds(lower)
}

// published reads how many events the relay has acknowledged.
func (e *env) published(ctx context.Context) (int, error) {
	var n int64
	err := e.pool.QueryRow(ctx, "SELECT coalesce(sum(published), 0) FROM outbox.checkpoints").Scan(&n)
	return int(n), err
}

// fill writes n events with cfg.Writers concurrent writers, each
// transaction holding up to EventsPerTx events. With rate > 0 the writers
// pace themselves to rate events/s in all. With xids set, it notes each
// event's transaction id by its number (the payload's digits).
func (e *env) fill(ctx context.Context, n, rate int, xids map[int]string) (written int, elapsed time.Duration, err error) {
	// Event number m = g + $3 goes to topic bench-(m mod topics) (or
	// "bench"), key key-((m div topics) mod keys), and its payload is m
	// padded with x to PayloadBytes, or to payloadSize(m) with PayloadMix.
	// The key divides by the topics first: with m mod keys, topics and
	// keys of the same count would give each topic one key, and so one
	// partition.
	// With Tracing, each event gets a traceparent (trace id and parent
	// span id from its number, sampled).
	insert := `INSERT INTO outbox.events (topic, key, payload, headers)
SELECT CASE WHEN $5::int = 1 THEN 'bench' ELSE 'bench-' || ((g + $3) % $5) END, 'key-' || (((g + $3) / $5) % $2),
    convert_to(lpad((g + $3)::text, CASE WHEN $6::bool
        THEN floor(100 * power(10000, (((g + $3)::bigint * 2654435761) % 1000003) / 1000003.0))::int
        ELSE $4 END, 'x'), 'UTF8'),
    CASE WHEN $7::bool THEN jsonb_build_object('traceparent',
        '00-' || lpad(to_hex(g + $3), 32, '0') || '-' || lpad(to_hex(g + $3), 16, '0') || '-01') END
FROM generate_series(1, $1) AS g`
	return e.fillWith(ctx, n, rate, insert, xids, e.cfg.PayloadBytes, e.cfg.Topics, e.cfg.PayloadMix, e.cfg.Tracing)
}

// payloadSize is the size fill gives event m's payload under PayloadMix:
// log-uniform between 100 B and 1,000,000 B, which with the key and the
// relay's headers stays under the relay's default --max-message-bytes
// (1 MiB) (the same formula as its SQL, up to rounding).
func payloadSize(m int) int {
	return int(math.Floor(100 * math.Pow(10000, float64((int64(m)*2654435761)%1_000_003)/1_000_003)))
}

// meanPayload is the mean payload size of events 1..n as fill writes
// them.
func (e *env) meanPayload(n int) int {
	if !e.cfg.PayloadMix || n <= 0 {
		return e.cfg.PayloadBytes
	}
	var sum int64
	for m := 1; m <= n; m++ {
		sum += int64(payloadSize(m))
	}
	return int(sum / int64(n))
}

// topics are the topics fill writes to.
func (e *env) topics() []string {
	if e.cfg.Topics <= 1 {
		return []string{benchTopic}
	}
	out := make([]string, e.cfg.Topics)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", benchTopic, i)
	}
	return out
}

// fillWith is fill with another insert statement: its $1 is the events in
// the transaction, $2 the number of keys, $3 the writer's offset, and $4
// on are extra.
func (e *env) fillWith(ctx context.Context, n, rate int, insert string, xids map[int]string, extra ...any) (written int, elapsed time.Duration, err error) {
	cfg := e.cfg
	if xids != nil {
		insert = `WITH ins AS (` + insert + ` RETURNING 1) SELECT pg_current_xact_id()::text FROM ins LIMIT 1`
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		errs  []error
		total int
	)
	start := time.Now()
	perWriter := (n + cfg.Writers - 1) / cfg.Writers
	for w := 0; w < cfg.Writers; w++ {
		quota := min(perWriter, n-w*perWriter)
		if quota <= 0 {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var interval time.Duration
			if rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(cfg.EventsPerTx*cfg.Writers) / float64(rate))
			}
			next := time.Now()
			for done := 0; done < quota; {
				if interval > 0 {
					if d := time.Until(next); d > 0 {
						select {
						case <-ctx.Done():
							return
						case <-time.After(d):
						}
					}
					next = next.Add(interval)
				}
				k := min(cfg.EventsPerTx, quota-done)
				args := append([]any{k, cfg.Keys, w*perWriter + done}, extra...)
				var err error
				if xids == nil {
					_, err = e.pool.Exec(ctx, insert, args...)
				} else {
					var xid string
					if err = e.pool.QueryRow(ctx, insert, args...).Scan(&xid); err == nil {
						mu.Lock()
						for g := 1; g <= k; g++ {
							xids[w*perWriter+done+g] = xid
						}
						mu.Unlock()
					}
				}
				if err != nil {
					if ctx.Err() == nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
					}
					return
				}
				done += k
				mu.Lock()
				total += k
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return total, time.Since(start), errors.Join(errs...)
}

// waitPublished waits until target events are acknowledged, returning the
// count reached when ctx ends first. Events the relay put in the dead
// letters instead (too large for --max-message-bytes, say) fail the wait
// once the published ones and they make up the target, rather than
// leaving it to wait forever.
func (e *env) waitPublished(ctx context.Context, target int) (int, error) {
	for i := 0; ; i++ {
		n, err := e.published(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return n, nil
			}
			return n, err
		}
		if n >= target {
			return n, nil
		}
		if i%100 == 99 {
			var dead int
			if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM outbox.dead_letters").Scan(&dead); err == nil && dead > 0 && n+dead >= target {
				return n, fmt.Errorf("%d events went to the dead letters instead of being published (see the relay's --max-message-bytes)", dead)
			}
		}
		select {
		case <-ctx.Done():
			return n, nil
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (e *env) walPosition(ctx context.Context) (string, error) {
	var lsn string
	err := e.pool.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
	return lsn, err
}
