package devcli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/outboxrelay/relay/internal/bench"
	"github.com/outboxrelay/relay/internal/cli"
)

// runBrokerBench is `relay-dev bench broker`: the broker alone, its open
// time on an existing data directory after a clean stop or a SIGKILL.
func runBrokerBench(ctx context.Context, stdio cli.IO, args []string) error {
	if os.Getenv(bench.BrokerChildEnv) != "" {
		return bench.BrokerChild(ctx, stdio.Stdout)
	}
	fs := cli.FlagSet("relay-dev bench broker", stdio)
	var cfg bench.BrokerConfig
	logBytes := fs.String("log-bytes", "1GiB", "bytes of log to write before the stop (a number with an optional KiB, MiB, GiB suffix)")
	fs.IntVar(&cfg.Topics, "topics", 1, "topics to spread the log over")
	fs.IntVar(&cfg.Partitions, "partitions", 8, "partitions per topic")
	fs.IntVar(&cfg.PayloadBytes, "payload-bytes", 200, "record value size")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct record keys (at most 10,000,000)")
	fs.BoolVar(&cfg.Compact, "compact", false, "compacted topics; after the open, time one compaction pass and report its peak RSS")
	segmentBytes := fs.String("segment-bytes", "", "the topics' segment.bytes (default 1GiB, 64MiB with --compact)")
	fs.BoolVar(&cfg.Kill, "kill", false, "SIGKILL the filling process once every append was acknowledged, instead of closing the broker")
	fs.IntVar(&cfg.MaxOpenFiles, "max-open-files", 0, "the broker's bound on segment files open for appending (0: one per partition)")
	fs.BoolVar(&cfg.Cold, "cold", false, "evict the data directory from the page cache before the open")
	fs.StringVar(&cfg.Dir, "dir", "", "data directory to fill, empty or new (default: a temporary one, removed afterwards)")
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	if err := cli.Parse(fs, args, stdio); err != nil {
		return err
	}
	n, err := parseBytes(*logBytes)
	if err != nil {
		return cli.Usagef("--log-bytes: %v", err)
	}
	cfg.LogBytes = n
	if *segmentBytes != "" {
		if cfg.SegmentBytes, err = parseBytes(*segmentBytes); err != nil {
			return cli.Usagef("--segment-bytes: %v", err)
		}
	}
	if cfg.Binary, err = os.Executable(); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stdio.Stderr, nil))
	res, err := bench.RunBroker(ctx, cfg)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdio.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	fmt.Fprintf(stdio.Stdout, "log: %.0f MiB, %d records of %d B, %d topics x %d partitions; topics created in %.2f s, filled in %.1f s (%.0f MiB/s)\n",
		mib(res.LogBytes), res.Records, res.PayloadBytes, res.Topics, res.Partitions, res.CreateSeconds, res.FillSeconds, res.FillMiBps)
	cache := "warm page cache"
	if res.Cold {
		cache = "cold page cache"
	}
	bound := "unbounded"
	if res.MaxOpenFiles > 0 {
		bound = fmt.Sprintf("at most %d", res.MaxOpenFiles)
	}
	fmt.Fprintf(stdio.Stdout, "open after %s (%s, segment files %s): %.3f s; RSS after open %.1f MiB, open files %d\n",
		res.Stop, cache, bound, res.OpenSeconds, mib(res.OpenRSSBytes), res.OpenFiles)
	if res.CompactSeconds > 0 {
		fmt.Fprintf(stdio.Stdout, "compaction, %d keys: %.2f s, peak RSS %.1f MiB, log %.0f MiB after\n",
			res.Keys, res.CompactSeconds, mib(res.CompactPeakRSSBytes), mib(res.BytesAfterCompact))
	}
	return nil
}

// parseBytes reads 1GiB, 512MiB, 64KiB or a plain number of bytes.
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = v, u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f <= 0 {
		return 0, fmt.Errorf("%q is not a positive size", s)
	}
	return int64(f * float64(mult)), nil
}
