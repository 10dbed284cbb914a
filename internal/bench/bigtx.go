package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// BigTxConfig is `relay-dev bench bigtx`: one transaction of Events
// outbox rows, published by the WAL reader into the embedded broker once
// per entry of Streaming (pgoutput streaming on or off), in that order,
// each with a slot and a topic of its own.
type BigTxConfig struct {
	// DatabaseURL is a server to use; empty starts a throwaway one.
	DatabaseURL  string
	Events       int
	PayloadBytes int
	Keys         int
	Streaming    []bool
	// WorkMem, when set, is the bench database's
	// logical_decoding_work_mem (say "64kB", so a small transaction
	// streams).
	WorkMem     string
	RelayBinary string
	RelayArgs   []string
	Logger      *slog.Logger
}

// BigTxResult is one publication of the big transaction.
type BigTxResult struct {
	Streaming bool `json:"streaming"`
	Events    int  `json:"events"`
	// WriteSeconds is the INSERT ... SELECT, committed;
	// PublishSeconds runs from its COMMIT to the last event acknowledged
	// by the relay (durable in the broker, its rows deleted).
	WriteSeconds   float64 `json:"write_seconds"`
	PublishSeconds float64 `json:"publish_seconds"`
	RSSPeakBytes   int64   `json:"rss_peak_bytes"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	// RelaySpillPeakBytes is the most the relay's spill directory held
	// (sampled every 200 ms).
	RelaySpillPeakBytes int64 `json:"relay_spill_peak_bytes"`
	// The slot's pg_stat_replication_slots counters for this run.
	SpillTxns   int64 `json:"spill_txns"`
	SpillCount  int64 `json:"spill_count"`
	SpillBytes  int64 `json:"spill_bytes"`
	StreamTxns  int64 `json:"stream_txns"`
	StreamCount int64 `json:"stream_count"`
	StreamBytes int64 `json:"stream_bytes"`
	TotalBytes  int64 `json:"total_bytes"`
	// Records is what the topic holds afterwards, read back through the
	// Kafka listener; OutOfOrder counts records of a key whose event
	// number is not above the key's previous one.
	Records    int `json:"records"`
	OutOfOrder int `json:"out_of_order"`
}

// RunBigTx runs the big transaction once per cfg.Streaming entry.
func RunBigTx(ctx context.Context, cfg BigTxConfig) ([]BigTxResult, error) {
	e, err := newEnv(ctx, Config{DatabaseURL: cfg.DatabaseURL, Source: "cdc", Sink: "embedded", Writers: 1, Logger: cfg.Logger,
		RelayBinary: cfg.RelayBinary, RelayArgs: cfg.RelayArgs})
	if err != nil {
		return nil, err
	}
	defer e.close()
	if cfg.WorkMem != "" {
		if _, err := e.pool.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s SET logical_decoding_work_mem = '%s'", e.dbName, strings.ReplaceAll(cfg.WorkMem, "'", "''"))); err != nil {
			return nil, fmt.Errorf("setting logical_decoding_work_mem: %w", err)
		}
	}
	var out []BigTxResult
	for i, on := range cfg.Streaming {
		res, err := e.bigTx(ctx, cfg, i, on)
		if err != nil {
			return out, err
		}
		cfg.Logger.Info("big transaction published", "streaming", on, "publish_seconds", res.PublishSeconds, "rss_peak_mib", res.RSSPeakBytes>>20)
		out = append(out, res)
	}
	return out, nil
}

func (e *env) bigTx(ctx context.Context, cfg BigTxConfig, i int, streaming bool) (BigTxResult, error) {
	res := BigTxResult{Streaming: streaming, Events: cfg.Events}
	slot := fmt.Sprintf("relay_bench_bigtx_%d", i)
	topic := fmt.Sprintf("bigtx-%d", i)
	if err := e.settle(ctx); err != nil {
		return res, err
	}
	kafkaAddr, err := freeAddr()
	if err != nil {
		return res, err
	}
	p, err := e.startRelayWith(ctx, "--slot", slot, "--cdc-streaming="+strconv.FormatBool(streaming), "--kafka-addr", kafkaAddr)
	if err != nil {
		return res, err
	}
	defer p.stop()
	var spillPeak atomic.Int64
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			if n := spillDirBytes(slot); n > spillPeak.Load() {
				spillPeak.Store(n)
			}
			select {
			case <-stopSampling:
				return
			case <-t.C:
			}
		}
	}()
	// A relay started right after the last one stopped is a standby until
	// that one's leadership lease runs out: wait until it streams.
	for waited := 0; ; waited++ {
		var active bool
		err := e.pool.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&active)
		if err == nil && active {
			break
		}
		if waited == 600 {
			return res, fmt.Errorf("the relay did not stream from slot %s within a minute", slot)
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	before, err := e.published(ctx)
	if err != nil {
		return res, err
	}
	if _, err := e.pool.Exec(ctx, "SELECT pg_stat_reset_replication_slot($1)", slot); err != nil {
		return res, fmt.Errorf("resetting the slot's statistics: %w", err)
	}
	cfg.Logger.Info("writing the big transaction", "events", cfg.Events, "streaming", streaming)
	start := time.Now()
	if _, err := e.pool.Exec(ctx, `INSERT INTO outbox.events (topic, key, payload)
SELECT $1, 'key-' || (g % $3), convert_to(lpad(g::text, $4, 'x'), 'UTF8') FROM generate_series(1, $2) AS g`,
		topic, cfg.Events, cfg.Keys, cfg.PayloadBytes); err != nil {
		return res, fmt.Errorf("the big transaction: %w", err)
	}
	committed := time.Now()
	res.WriteSeconds = committed.Sub(start).Seconds()
	cfg.Logger.Info("committed; waiting for the relay", "write_seconds", res.WriteSeconds)
	n, err := e.waitPublished(ctx, before+cfg.Events)
	res.PublishSeconds = time.Since(committed).Seconds()
	close(stopSampling)
	<-sampled
	res.RelaySpillPeakBytes = spillPeak.Load()
	res.RSSPeakBytes, res.CPUSeconds = p.usage()
	if err != nil {
		return res, err
	}
	if n < before+cfg.Events {
		return res, fmt.Errorf("interrupted after %d of %d events", n-before, cfg.Events)
	}
	// The statistics reach the view within about a second of the
	// walsender counting them.
	time.Sleep(2 * time.Second)
	err = e.pool.QueryRow(ctx, `SELECT spill_txns, spill_count, spill_bytes, stream_txns, stream_count, stream_bytes, total_bytes
FROM pg_stat_replication_slots WHERE slot_name = $1`, slot).Scan(&res.SpillTxns, &res.SpillCount, &res.SpillBytes,
		&res.StreamTxns, &res.StreamCount, &res.StreamBytes, &res.TotalBytes)
	if err != nil {
		return res, fmt.Errorf("reading pg_stat_replication_slots: %w", err)
	}
	cfg.Logger.Info("reading the topic back", "topic", topic)
	if res.Records, res.OutOfOrder, err = checkTopic(ctx, kafkaAddr, topic, cfg.Events); err != nil {
		return res, err
	}
	p.stop()
	if _, err := e.pool.Exec(ctx, "SELECT pg_drop_replication_slot($1)", slot); err != nil {
		cfg.Logger.Warn("dropping the run's slot failed", "slot", slot, "err", err)
	}
	return res, nil
}

// spillDirBytes is the size of the relay's spill files for slot (the
// cdc reader's default directory, under the temporary directory).
func spillDirBytes(slot string) int64 {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "relay-cdc-spill-*-"+slot))
	var n int64
	for _, d := range dirs {
		entries, _ := os.ReadDir(d)
		for _, de := range entries {
			if info, err := de.Info(); err == nil {
				n += info.Size()
			}
		}
	}
	return n
}

// checkTopic reads topic from its start until it has held still for 3 s
// after at least want records, counting records and those whose event
// number (the payload without its 'x' padding) is not above the previous
// one of its key.
func checkTopic(ctx context.Context, addr, topic string, want int) (records, outOfOrder int, err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	last := map[string]int{}
	deadline := time.Now().Add(10 * time.Minute)
	quietSince := time.Now()
	for time.Now().Before(deadline) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		if ctx.Err() != nil {
			return records, outOfOrder, ctx.Err()
		}
		got := 0
		fs.EachRecord(func(r *kgo.Record) {
			got++
			v, _ := strconv.Atoi(strings.TrimLeft(string(r.Value), "x"))
			if prev, ok := last[string(r.Key)]; ok && v <= prev {
				outOfOrder++
			}
			last[string(r.Key)] = v
		})
		records += got
		if got > 0 {
			quietSince = time.Now()
		} else if records >= want && time.Since(quietSince) > 3*time.Second {
			return records, outOfOrder, nil
		}
	}
	return records, outOfOrder, fmt.Errorf("read %d of %d records of %s within 10 minutes", records, want, topic)
}
