package bench

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/internal/procstat"
)

func (e *env) result(mode string) Result {
	return Result{Source: e.cfg.Source, Sink: e.cfg.Sink, Mode: mode, Events: e.cfg.Events,
		Topics: e.cfg.Topics, Partitions: e.cfg.Partitions, PayloadBytes: e.meanPayload(e.cfg.Events)}
}

// measureRelay fills in the relay's resource use and latency before it is
// stopped.
func (r *Result) measureRelay(p *relayProc) {
	r.RSSPeakBytes, r.CPUSeconds = p.usage()
	if r.Published > 0 {
		r.CPUPerEvent = (r.CPUSeconds - p.cpuMark) / float64(r.Published) * 1e6
	}
	p.noteFiles()
	r.OpenFiles = int(p.maxFiles.Load())
	r.LatencyFrom, r.LatencyP50, r.LatencyP90, r.LatencyP99, r.LatencyMax, _ = p.latency()
	// Interpolating inside a bucket can overshoot the largest value seen.
	if r.LatencyMax > 0 {
		r.LatencyP50 = min(r.LatencyP50, r.LatencyMax)
		r.LatencyP90 = min(r.LatencyP90, r.LatencyMax)
		r.LatencyP99 = min(r.LatencyP99, r.LatencyMax)
	}
}

// backlog writes every event, then times the relay draining them, then the
// baseline on an identical backlog.
func (e *env) backlog(ctx context.Context) (Result, error) {
	res := e.result("backlog")
	log := e.cfg.Logger
	if e.cfg.Source == "cdc" {
		// The relay's slot must exist before the backlog, or the backlog
		// would be read from the table on its first start.
		p, err := e.startRelay(ctx)
		if err != nil {
			return res, err
		}
		p.stop()
		if e.cfg.Baseline {
			if _, err := e.pool.Exec(ctx, "SELECT pg_create_logical_replication_slot('relay_bench_baseline', 'pgoutput')"); err != nil {
				return res, fmt.Errorf("creating the baseline slot: %w", err)
			}
		}
	}
	// Each run starts from a settled database: no dead rows of an earlier
	// run for autovacuum to clean up, no checkpoint due, during this one.
	if err := e.settle(ctx); err != nil {
		return res, err
	}
	log.Info("writing the backlog", "events", e.cfg.Events)
	written, took, err := e.fill(ctx, e.cfg.Events, 0, nil)
	res.Written = written
	if took > 0 {
		res.WriteRate = float64(written) / took.Seconds()
	}
	if err != nil || ctx.Err() != nil {
		res.Interrupted = ctx.Err() != nil
		return res, err
	}
	endLSN, err := e.walPosition(ctx)
	if err != nil {
		return res, err
	}
	before, err := e.published(ctx)
	if err != nil {
		return res, err
	}
	var extra []string
	var kafkaAddr string
	if e.cfg.Consumers > 0 {
		if kafkaAddr, err = freeAddr(); err != nil {
			return res, err
		}
		extra = []string{"--kafka-addr", kafkaAddr}
	}
	p, err := e.startRelayWith(ctx, extra...)
	if err != nil {
		return res, err
	}
	log.Info("draining with the relay", "http", p.addr)
	n, err := e.waitPublished(ctx, before+written)
	res.Elapsed = time.Since(p.started)
	res.Published = n - before
	res.PublishRate = float64(res.Published) / res.Elapsed.Seconds()
	res.measureRelay(p)
	if err == nil && ctx.Err() == nil && e.cfg.Consumers > 0 {
		log.Info("reading the backlog back through the relay's Kafka listener", "consumers", e.cfg.Consumers, "addr", kafkaAddr)
		var idleErr error
		idle := func() {
			if e.cfg.IdleRSS > 0 {
				log.Info("idle with the consumers connected", "for", e.cfg.IdleRSS)
				res.IdleRSSBytes, res.IdleAnonRSSBytes, idleErr = p.idleRSS(ctx, e.cfg.IdleRSS)
			}
		}
		res.Consume, err = readBack(ctx, kafkaAddr, e.topics(), n, e.cfg.Consumers, idle)
		err = errors.Join(err, idleErr)
		p.noteFiles()
		res.OpenFiles = int(p.maxFiles.Load())
	} else if err == nil && ctx.Err() == nil && e.cfg.IdleRSS > 0 {
		log.Info("idle", "for", e.cfg.IdleRSS)
		res.IdleRSSBytes, res.IdleAnonRSSBytes, err = p.idleRSS(ctx, e.cfg.IdleRSS)
	}
	p.stop()
	if err == nil && ctx.Err() == nil && e.cfg.Restarts > 0 {
		res.ReadySeconds, err = e.restarts(ctx, e.cfg.Restarts, extra)
	}
	if err != nil {
		return res, err
	}
	if ctx.Err() != nil {
		res.Interrupted = true
		return res, nil
	}
	if !e.cfg.Baseline {
		return res, nil
	}
	// The baseline starts from a settled database, as the relay did:
	// otherwise the rows the relay deleted are autovacuum's to clean up
	// while the baseline runs, and a checkpoint may fall due in it.
	if err := e.settle(ctx); err != nil {
		return res, err
	}
	var base *Baseline
	if e.cfg.Source == "poll" {
		base, err = e.deleteReturningBaseline(ctx)
	} else {
		base, err = e.recvlogicalBaseline(ctx, endLSN, written)
	}
	if err != nil {
		return res, err
	}
	if base != nil && base.Rate > 0 {
		base.Ratio = res.PublishRate / base.Rate
	}
	res.Baseline = base
	res.Interrupted = ctx.Err() != nil
	return res, nil
}

// awaitCaughtUp waits until the relay's slot has confirmed the WAL written
// before the relay started. A restarted WAL reader first decodes again what
// lies between the slot's restart point and its confirmed position (up to
// about 15 s of WAL, PostgreSQL's running-transactions interval): events
// written meanwhile wait, up to ~150 ms at 10,000 events/s, which is a
// restart's cost, not the steady state a live run measures.
func (e *env) awaitCaughtUp(ctx context.Context) error {
	lsn, err := e.walPosition(ctx)
	if err != nil {
		return err
	}
	start := time.Now()
	for {
		var done bool
		err := e.pool.QueryRow(ctx, `SELECT coalesce(bool_or(confirmed_flush_lsn >= $1::pg_lsn), false)
FROM pg_replication_slots WHERE slot_name IN (SELECT slot_name FROM outbox.cdc_slots)`, lsn).Scan(&done)
		if err != nil {
			return fmt.Errorf("reading the relay's slot: %w", err)
		}
		if done {
			e.cfg.Logger.Info("the relay has caught up with the WAL", "took", time.Since(start).Round(time.Millisecond))
			return nil
		}
		if time.Since(start) > time.Minute {
			return errors.New("the relay did not catch up with the WAL within a minute")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// settle vacuums the outbox and runs a checkpoint.
func (e *env) settle(ctx context.Context) error {
	for _, q := range []string{"VACUUM outbox.events", "CHECKPOINT"} {
		if _, err := e.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("settling the database (%s): %w", q, err)
		}
	}
	return nil
}

// deleteReturningBaseline writes the same backlog again and drains it with
// plain SQL, 1,000 rows per statement, in (txid, id) order (the order of
// the reader before ticks, kept so that ratios stay comparable).
func (e *env) deleteReturningBaseline(ctx context.Context) (*Baseline, error) {
	e.cfg.Logger.Info("writing the baseline backlog")
	written, _, err := e.fill(ctx, e.cfg.Events, 0, nil)
	if err != nil || ctx.Err() != nil {
		return nil, err
	}
	e.cfg.Logger.Info("draining with DELETE ... RETURNING")
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	// The baseline deletes rows as the relay's acknowledgement does, past
	// the outbox's immutability trigger (migration 011).
	if _, err := conn.Exec(ctx, "SET relay.allow_outbox_changes = on"); err != nil {
		return nil, err
	}
	defer conn.Exec(context.WithoutCancel(ctx), "RESET relay.allow_outbox_changes")
	const drain = `DELETE FROM outbox.events WHERE id IN (
    SELECT id FROM outbox.events ORDER BY txid, id LIMIT 1000)
RETURNING id, event_id, topic, key, payload, headers, created_at`
	start := time.Now()
	got := 0
	for got < written {
		rows, err := conn.Query(ctx, drain)
		if err != nil {
			return nil, err
		}
		n := 0
		for rows.Next() {
			var id int64
			var eventID [16]byte
			var topic string
			var key *string
			var payload, headers []byte
			var created time.Time
			if err := rows.Scan(&id, &eventID, &topic, &key, &payload, &headers, &created); err != nil {
				rows.Close()
				return nil, err
			}
			n++
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
		got += n
	}
	return &Baseline{Name: "DELETE ... RETURNING, 1000 rows per statement", Rate: float64(got) / time.Since(start).Seconds()}, nil
}

// recvlogicalBaseline decodes the backlog's WAL range with pg_recvlogical
// and pgoutput into /dev/null.
func (e *env) recvlogicalBaseline(ctx context.Context, endLSN string, events int) (*Baseline, error) {
	bin, err := findRecvlogical()
	if err != nil {
		return nil, err
	}
	e.cfg.Logger.Info("decoding the same WAL with pg_recvlogical")
	// The same pgoutput options as the relay's reader: binary values
	// from PostgreSQL 14 on, which spares the walsender the types' output
	// functions.
	var version int
	if err := e.pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return nil, err
	}
	args := []string{"-d", e.url, "--slot", "relay_bench_baseline", "--start", "--endpos", endLSN, "--no-loop",
		"-o", "proto_version=1", "-o", "publication_names=relay_outbox", "-o", "messages=true", "-f", "/dev/null"}
	name := "pg_recvlogical pgoutput to /dev/null"
	if version >= 140000 {
		args = append(args, "-o", "binary=true")
		name += " (binary values, as the relay)"
	}
	start := time.Now()
	cmd := exec.CommandContext(ctx, bin, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pg_recvlogical: %w: %s", err, out)
	}
	took := time.Since(start)
	e.pool.Exec(context.WithoutCancel(ctx), "SELECT pg_drop_replication_slot('relay_bench_baseline')")
	return &Baseline{Name: name, Rate: float64(events) / took.Seconds()}, nil
}

func findRecvlogical() (string, error) {
	if p, err := exec.LookPath("pg_recvlogical"); err == nil {
		return p, nil
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_recvlogical"); len(m) > 0 {
		return m[len(m)-1], nil
	}
	return "", errors.New("pg_recvlogical is not installed (Debian: apt-get install postgresql-client)")
}

// live runs writers and the relay together.
func (e *env) live(ctx context.Context) (Result, error) {
	res := e.result("live")
	if err := e.settle(ctx); err != nil {
		return res, err
	}
	p, err := e.startRelay(ctx)
	if err != nil {
		return res, err
	}
	defer p.stop()
	if e.cfg.LongTx {
		res.Mode = "live+long-tx"
		release, err := e.holdForeignTx(ctx)
		if err != nil {
			return res, err
		}
		defer release()
	}
	if e.cfg.Source == "cdc" {
		if err := e.awaitCaughtUp(ctx); err != nil {
			return res, err
		}
	}
	before, err := e.published(ctx)
	if err != nil {
		return res, err
	}
	var (
		arr  *arrivals
		xids map[int]string
	)
	if e.brokers != nil {
		if arr, err = consume(ctx, e.brokers, e.topics(), int32(e.cfg.Partitions)); err != nil {
			return res, err
		}
		defer arr.close()
		xids = map[int]string{}
	}
	e.cfg.Logger.Info("writing while the relay runs", "events", e.cfg.Events, "rate", e.cfg.Rate, "writers", e.cfg.Writers, "http", p.addr)
	// CPU per event counts from here: the relay's start and catching up
	// are not the live cost.
	_, p.cpuMark = p.usage()
	start := time.Now()
	stopWindows := func() {}
	if e.cfg.Window > 0 {
		wctx, stop := context.WithCancel(ctx)
		windows := e.watchWindows(wctx, p, start)
		var once sync.Once
		stopWindows = func() { once.Do(func() { stop(); res.Windows = <-windows }) }
		defer stopWindows()
	}
	written, took, err := e.fill(ctx, e.cfg.Events, e.cfg.Rate, xids)
	res.Written = written
	if took > 0 {
		res.WriteRate = float64(written) / took.Seconds()
	}
	if err != nil {
		return res, err
	}
	n, err := e.waitPublished(ctx, before+written)
	res.Elapsed = time.Since(start)
	stopWindows()
	res.Published = n - before
	res.PublishRate = float64(res.Published) / res.Elapsed.Seconds()
	res.measureRelay(p)
	res.Interrupted = ctx.Err() != nil
	if err != nil || arr == nil || res.Interrupted {
		return res, err
	}
	if got := arr.waitFor(written, 10*time.Second); got < written {
		e.cfg.Logger.Warn("the arrival consumer did not see every event", "arrived", got, "written", written)
	}
	var commits map[int]time.Time
	if e.cfg.Source == "cdc" {
		if commits, err = e.commitTimes(ctx, xids); err != nil {
			return res, err
		}
	}
	res.measureArrival(arr.latencies(commits))
	return res, nil
}

// holdForeignTx opens a transaction in the cluster's administrative
// database (not the bench's), writes a row so that it has a transaction id,
// and leaves it open until release.
func (e *env) holdForeignTx(ctx context.Context) (release func(), err error) {
	conn, err := pgconfig.Connect(ctx, e.adminURL)
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, `CREATE TEMP TABLE relay_bench_long_tx (n bigint) ON COMMIT DROP`)
	}
	if err == nil {
		_, err = tx.Exec(ctx, `INSERT INTO relay_bench_long_tx VALUES (1)`)
	}
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("holding a transaction in another database: %w", err)
	}
	e.cfg.Logger.Info("holding a writing transaction open in another database for the run")
	return func() {
		bg := context.WithoutCancel(ctx)
		tx.Rollback(bg)
		conn.Close(bg)
	}, nil
}

// idleRSS waits d with the relay idle and returns its resident set then,
// and the anonymous part of it.
func (p *relayProc) idleRSS(ctx context.Context, d time.Duration) (rss, anon int64, err error) {
	select {
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	case <-p.done:
		return 0, 0, errors.New("the relay exited while idle")
	case <-time.After(d):
	}
	pid := p.cmd.Process.Pid
	if rss, err = procstat.RSS(pid); err == nil {
		anon, err = procstat.AnonRSS(pid)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("reading the relay's RSS: %w", err)
	}
	return rss, anon, nil
}

// restarts starts the relay n times over the data directory the drain
// left, each after a clean stop, and returns each start's time from exec
// to the first 200 of /readyz.
func (e *env) restarts(ctx context.Context, n int, extra []string) ([]float64, error) {
	var out []float64
	for i := 0; i < n; i++ {
		p, err := e.startRelayWith(ctx, extra...)
		if err != nil {
			return out, err
		}
		out = append(out, p.ready.Sub(p.started).Seconds())
		p.stop()
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			return out, fmt.Errorf("the relay exited with status %d on SIGTERM (log: %s)", code, p.logPath)
		}
	}
	return out, nil
}
