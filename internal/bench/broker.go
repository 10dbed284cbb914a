package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/procstat"
)

// BrokerChildEnv, when set in the environment of `relay-dev bench broker`,
// makes it the child of a broker-only run (BrokerChild): the JSON of one
// step to do in its own process, so that the parent can SIGKILL it or
// measure a fresh process's open.
const BrokerChildEnv = "RELAY_BENCH_BROKER_CHILD"

// BrokerConfig is a broker-only run, `relay-dev bench broker`: a child
// process fills a data directory through the broker's Go API (every
// append acknowledged, under the default fsync-before-ack policy), then
// either closes the broker (a clean stop) or is SIGKILLed (Kill); a fresh
// child then opens the directory and reports the time Open took, its RSS
// and open file descriptors, and checks that every acknowledged record is
// there. With Compact the topics are compacted ones with 64 MiB segments
// (SegmentBytes) and the opening child then runs one compaction pass, timed, with its
// peak RSS.
type BrokerConfig struct {
	// Dir is the data directory; empty makes a temporary one, removed at
	// the end.
	Dir          string
	LogBytes     int64
	Topics       int
	Partitions   int
	PayloadBytes int
	Keys         int
	Compact      bool
	// SegmentBytes is the topics' segment.bytes (default: the broker's,
	// 1 GiB; 64 MiB with Compact, so that segments roll and compaction
	// has inactive ones to clean).
	SegmentBytes int64
	Kill         bool
	// MaxOpenFiles is broker.Options.MaxOpenFiles, in both children.
	MaxOpenFiles int
	// Cold evicts the directory's files from the page cache
	// (posix_fadvise DONTNEED, after an fdatasync so that the pages are
	// clean) before the open, so that it reads from the disk.
	Cold bool
	// Binary is the executable run as the child (this binary).
	Binary string
	Logger *slog.Logger
}

// BrokerResult is what a broker-only run measured.
type BrokerResult struct {
	Topics       int   `json:"topics"`
	Partitions   int   `json:"partitions_per_topic"`
	LogBytes     int64 `json:"log_bytes"`
	Records      int64 `json:"records"`
	PayloadBytes int   `json:"payload_bytes"`
	Keys         int   `json:"keys"`
	// Stop is "clean" (Close) or "SIGKILL".
	Stop         string `json:"stop"`
	Cold         bool   `json:"cold"`
	MaxOpenFiles int    `json:"max_open_files,omitempty"`
	// CreateSeconds is CreateTopic of every bench topic, before the fill.
	CreateSeconds float64 `json:"create_seconds"`
	FillSeconds   float64 `json:"fill_seconds"`
	FillMiBps     float64 `json:"fill_mib_per_second"`
	// OpenSeconds is how long broker.Open took in a fresh process.
	OpenSeconds float64 `json:"open_seconds"`
	// OpenRSSBytes and OpenFiles are the opening process's after Open.
	OpenRSSBytes int64 `json:"open_rss_bytes"`
	OpenFiles    int   `json:"open_files"`
	// CompactSeconds is one compaction pass (Compact), and
	// CompactPeakRSSBytes the process's peak RSS after it.
	CompactSeconds      float64 `json:"compact_seconds,omitempty"`
	CompactPeakRSSBytes int64   `json:"compact_peak_rss_bytes,omitempty"`
	// BytesAfterCompact is the log's size after compaction.
	BytesAfterCompact int64 `json:"bytes_after_compact,omitempty"`
}

// brokerStep is one child's work.
type brokerStep struct {
	Role string // "fill" or "open"
	BrokerConfig
}

// brokerReport is a child's answer, one JSON line on its stdout.
type brokerReport struct {
	Records             int64   `json:"records"`
	Bytes               int64   `json:"bytes"`
	CreateSeconds       float64 `json:"create_seconds"`
	Seconds             float64 `json:"seconds"`
	RSS                 int64   `json:"rss"`
	Files               int     `json:"files"`
	CompactSeconds      float64 `json:"compact_seconds"`
	CompactPeakRSS      int64   `json:"compact_peak_rss"`
	BytesAfterCompact   int64   `json:"bytes_after_compact"`
	RecordsAfterCompact int64   `json:"records_after_compact"`
}

func (c BrokerConfig) withDefaults() BrokerConfig {
	positiveOr(&c.LogBytes, 1<<30)
	positiveOr(&c.Topics, 1)
	positiveOr(&c.Partitions, 8)
	positiveOr(&c.PayloadBytes, 200)
	positiveOr(&c.Keys, 1000)
	if c.SegmentBytes <= 0 && c.Compact {
		c.SegmentBytes = 64 << 20
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// RunBroker runs a broker-only bench.
func RunBroker(ctx context.Context, cfg BrokerConfig) (BrokerResult, error) {
	cfg = cfg.withDefaults()
	res := BrokerResult{Topics: cfg.Topics, Partitions: cfg.Partitions, PayloadBytes: cfg.PayloadBytes, Keys: cfg.Keys, Stop: "clean", Cold: cfg.Cold, MaxOpenFiles: cfg.MaxOpenFiles}
	switch {
	case cfg.Keys > maxKeys:
		return res, fmt.Errorf("--keys %d: at most %d", cfg.Keys, maxKeys)
	case cfg.Topics*cfg.Partitions > 100_000:
		return res, fmt.Errorf("%d topics of %d partitions: at most 100,000 partitions in all", cfg.Topics, cfg.Partitions)
	case cfg.PayloadBytes > 1<<20-200:
		return res, fmt.Errorf("--payload-bytes %d: at most 1 MiB less 200 bytes (one record per batch)", cfg.PayloadBytes)
	case cfg.Binary == "":
		return res, errors.New("the bench binary is unknown")
	}
	if cfg.Kill {
		res.Stop = "SIGKILL"
	}
	if cfg.Dir == "" {
		dir, err := os.MkdirTemp("", "relay-bench-broker-*")
		if err != nil {
			return res, err
		}
		defer os.RemoveAll(dir)
		cfg.Dir = dir
	} else if ents, err := os.ReadDir(cfg.Dir); err == nil && len(ents) > 0 {
		return res, fmt.Errorf("%s is not empty: the bench fills a new data directory", cfg.Dir)
	}
	cfg.Logger.Info("filling a data directory", "dir", cfg.Dir, "bytes", cfg.LogBytes, "topics", cfg.Topics, "partitions", cfg.Partitions)
	fill, err := runBrokerChild(ctx, brokerStep{Role: "fill", BrokerConfig: cfg}, cfg.Kill)
	if err != nil {
		return res, err
	}
	res.Records, res.LogBytes, res.FillSeconds, res.CreateSeconds = fill.Records, fill.Bytes, fill.Seconds, fill.CreateSeconds
	res.FillMiBps = float64(fill.Bytes) / (1 << 20) / fill.Seconds
	if cfg.Cold {
		if err := evictDir(cfg.Dir); err != nil {
			return res, err
		}
	}
	cfg.Logger.Info("opening the data directory in a fresh process", "after", res.Stop, "cold", cfg.Cold)
	open, err := runBrokerChild(ctx, brokerStep{Role: "open", BrokerConfig: cfg}, false)
	if err != nil {
		return res, err
	}
	if open.Records != fill.Records {
		return res, fmt.Errorf("the reopened broker holds %d records, %d were acknowledged", open.Records, fill.Records)
	}
	res.OpenSeconds, res.OpenRSSBytes, res.OpenFiles = open.Seconds, open.RSS, open.Files
	res.CompactSeconds, res.CompactPeakRSSBytes, res.BytesAfterCompact = open.CompactSeconds, open.CompactPeakRSS, open.BytesAfterCompact
	return res, nil
}

// runBrokerChild runs one step in a child process and returns its report;
// with kill it SIGKILLs the child once the report arrived.
func runBrokerChild(ctx context.Context, step brokerStep, kill bool) (brokerReport, error) {
	var rep brokerReport
	spec, err := json.Marshal(step)
	if err != nil {
		return rep, err
	}
	cmd := exec.Command(step.Binary, "bench", "broker")
	cmd.Env = append(os.Environ(), BrokerChildEnv+"="+string(spec))
	cmd.Stderr = os.Stderr
	// A fill child waiting for its SIGKILL must not outlive the bench.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return rep, err
	}
	if err := cmd.Start(); err != nil {
		return rep, fmt.Errorf("starting the broker bench child: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { cmd.Process.Kill() })
	defer stop()
	line, rerr := bufio.NewReader(out).ReadBytes('\n')
	if kill && rerr == nil {
		cmd.Process.Signal(syscall.SIGKILL)
	}
	io.Copy(io.Discard, out)
	werr := cmd.Wait()
	if rerr != nil {
		return rep, fmt.Errorf("the broker bench child (%s) reported nothing: %v", step.Role, errors.Join(rerr, werr))
	}
	if !kill && werr != nil {
		return rep, fmt.Errorf("the broker bench child (%s): %w", step.Role, werr)
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, fmt.Errorf("the broker bench child (%s): %w: %q", step.Role, err, line)
	}
	return rep, nil
}

// evictDir drops the page cache of every file under dir.
func evictDir(dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			return fmt.Errorf("fdatasync %s: %w", path, err)
		}
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
}

// BrokerChild does the step the environment names and writes its report
// to w; after a fill for a SIGKILL run it then waits to be killed.
func BrokerChild(ctx context.Context, w io.Writer) error {
	var step brokerStep
	if err := json.Unmarshal([]byte(os.Getenv(BrokerChildEnv)), &step); err != nil {
		return fmt.Errorf("%s: %w", BrokerChildEnv, err)
	}
	var (
		rep brokerReport
		err error
	)
	switch step.Role {
	case "fill":
		rep, err = fillBroker(ctx, step.BrokerConfig)
	case "open":
		rep, err = openBroker(ctx, step.BrokerConfig)
	default:
		err = fmt.Errorf("%s: unknown role %q", BrokerChildEnv, step.Role)
	}
	if err != nil {
		return err
	}
	if err := json.NewEncoder(w).Encode(rep); err != nil {
		return err
	}
	if step.Role == "fill" && step.Kill {
		<-ctx.Done()
	}
	return nil
}

func brokerOptions(cfg BrokerConfig) broker.Options {
	return broker.Options{Dir: cfg.Dir, DefaultPartitions: int32(cfg.Partitions), JanitorInterval: -1, MaxOpenFiles: cfg.MaxOpenFiles,
		ScrubBytesPerSecond: -1, ReopenInterval: -1, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
}

func benchTopicName(i, topics int) string {
	if topics == 1 {
		return benchTopic
	}
	return benchTopic + "-" + strconv.Itoa(i)
}

// fillBroker appends LogBytes of batches, about 64 KiB each (one record
// when a payload is larger), round robin over every partition, from
// eight appenders, each with one batch in flight while the previous one
// waits for its fsync.
func fillBroker(ctx context.Context, cfg BrokerConfig) (brokerReport, error) {
	var rep brokerReport
	b, err := broker.Open(ctx, brokerOptions(cfg))
	if err != nil {
		return rep, err
	}
	closed := false
	defer func() {
		if !closed {
			b.Close()
		}
	}()
	tc := broker.TopicConfig{Partitions: int32(cfg.Partitions), RetentionMs: -1, SegmentBytes: cfg.SegmentBytes}
	if cfg.Compact {
		tc.CleanupPolicy = broker.CleanupCompact
	}
	created := time.Now()
	for i := 0; i < cfg.Topics; i++ {
		if _, err := b.CreateTopic(benchTopicName(i, cfg.Topics), tc); err != nil {
			return rep, err
		}
	}
	rep.CreateSeconds = time.Since(created).Seconds()
	perBatch := max(1, (64<<10)/(cfg.PayloadBytes+30))
	payload := make([]byte, cfg.PayloadBytes)
	for i := range payload {
		payload[i] = 'x'
	}
	const appenders = 8
	total := cfg.Topics * cfg.Partitions
	var (
		mu      sync.Mutex
		written int64
		records int64
		nextKey int64
		errs    []error
		wg      sync.WaitGroup
	)
	start := time.Now()
	for a := 0; a < appenders; a++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait := func() error { return nil }
			defer func() {
				if err := wait(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}()
			recs := make([]broker.Record, perBatch)
			for i := a; ; i += appenders {
				mu.Lock()
				if written >= cfg.LogBytes || len(errs) > 0 {
					mu.Unlock()
					return
				}
				k := nextKey
				nextKey += int64(perBatch)
				mu.Unlock()
				for r := range recs {
					recs[r] = broker.Record{Key: []byte("key-" + strconv.FormatInt((k+int64(r))%int64(cfg.Keys), 10)), Value: payload}
				}
				batch := broker.EncodeBatch(-1, 0, 0, recs)
				part := i % total
				_, next, err := b.AppendAsync(ctx, benchTopicName(part/cfg.Partitions, cfg.Topics), int32(part%cfg.Partitions), batch)
				if err == nil {
					err = wait()
				}
				if err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				wait = next
				mu.Lock()
				written += int64(len(batch))
				records += int64(perBatch)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return rep, err
	}
	rep.Seconds = time.Since(start).Seconds()
	rep.Records, rep.Bytes = records, written
	if !cfg.Kill {
		closed = true
		if err := b.Close(); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// openBroker opens the directory, counts its records, and with Compact
// runs one compaction pass.
func openBroker(ctx context.Context, cfg BrokerConfig) (brokerReport, error) {
	var rep brokerReport
	start := time.Now()
	b, err := broker.Open(ctx, brokerOptions(cfg))
	if err != nil {
		return rep, err
	}
	defer b.Close()
	rep.Seconds = time.Since(start).Seconds()
	pid := os.Getpid()
	rep.RSS, _ = procstat.RSS(pid)
	rep.Files, _ = procstat.OpenFiles(pid)
	count := func() (int64, error) {
		var n int64
		for i := 0; i < cfg.Topics; i++ {
			for p := 0; p < cfg.Partitions; p++ {
				first, end, err := b.Offsets(benchTopicName(i, cfg.Topics), int32(p))
				if err != nil {
					return 0, err
				}
				n += end - first
			}
		}
		return n, nil
	}
	if rep.Records, err = count(); err != nil {
		return rep, err
	}
	if cfg.Compact {
		start := time.Now()
		if err := b.Compact(ctx); err != nil {
			return rep, err
		}
		rep.CompactSeconds = time.Since(start).Seconds()
		rep.CompactPeakRSS, _ = procstat.PeakRSS(pid)
		rep.BytesAfterCompact, err = dirBytes(filepath.Join(cfg.Dir, "topics"), ".log")
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// dirBytes sums the sizes of the files under dir whose names end in
// suffix.
func dirBytes(dir, suffix string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() || filepath.Ext(path) != suffix {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	return n, err
}
