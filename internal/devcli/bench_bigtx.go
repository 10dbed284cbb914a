package devcli

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/outboxrelay/relay/internal/bench"
	"github.com/outboxrelay/relay/internal/cli"
)

// runBigTxBench is `relay-dev bench bigtx`: one large transaction
// published by the WAL reader with pgoutput streaming and without.
func runBigTxBench(ctx context.Context, stdio cli.IO, args []string) error {
	fs := cli.FlagSet("relay-dev bench bigtx", stdio)
	var cfg bench.BigTxConfig
	fs.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL server to use (default: start a throwaway one from the local binaries)")
	fs.IntVar(&cfg.Events, "events", 5_000_000, "rows in the one transaction")
	fs.IntVar(&cfg.PayloadBytes, "payload-bytes", 100, "payload size")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct keys")
	fs.StringVar(&cfg.WorkMem, "logical-decoding-work-mem", "", "the bench database's logical_decoding_work_mem, say 64kB (default: the server's)")
	order := fs.String("streaming", "on,off", "runs in order, each on (pgoutput streaming) or off (--cdc-streaming=false)")
	var child childRelay
	child.register(fs)
	asJSON := fs.Bool("json", false, "print JSON instead of text")
	if err := cli.Parse(fs, args, stdio); err != nil {
		return err
	}
	for _, v := range strings.Split(*order, ",") {
		switch strings.TrimSpace(v) {
		case "on":
			cfg.Streaming = append(cfg.Streaming, true)
		case "off":
			cfg.Streaming = append(cfg.Streaming, false)
		default:
			return cli.Usagef("--streaming %q: a comma-separated list of on and off", *order)
		}
	}
	if cfg.Events < 1 || cfg.PayloadBytes < 1 || cfg.Keys < 1 {
		return cli.Usagef("--events, --payload-bytes and --keys must be positive")
	}
	var err error
	if cfg.RelayBinary, cfg.RelayArgs, err = child.relay(); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stdio.Stderr, nil))
	results, err := bench.RunBigTx(ctx, cfg)
	if *asJSON {
		enc := json.NewEncoder(stdio.Stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(results); jerr != nil {
			return jerr
		}
		return err
	}
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	for _, r := range results {
		mode := "streaming off (protocol 1)"
		if r.Streaming {
			mode = "streaming on (protocol 2)"
		}
		fmt.Fprintf(stdio.Stdout, "%s: %d events of %d B in one transaction; written in %.1f s, published %.1f s after its commit; relay peak RSS %.1f MiB, CPU %.1f s, relay spill peak %.0f MiB\n",
			mode, r.Events, cfg.PayloadBytes, r.WriteSeconds, r.PublishSeconds, mib(r.RSSPeakBytes), r.CPUSeconds, mib(r.RelaySpillPeakBytes))
		fmt.Fprintf(stdio.Stdout, "  server (pg_stat_replication_slots): spill_txns %d, spill_count %d, spill_bytes %.0f MiB; stream_txns %d, stream_count %d, stream_bytes %.0f MiB; total_bytes %.0f MiB\n",
			r.SpillTxns, r.SpillCount, mib(r.SpillBytes), r.StreamTxns, r.StreamCount, mib(r.StreamBytes), mib(r.TotalBytes))
		fmt.Fprintf(stdio.Stdout, "  log: %d records (want %d), %d out of key order\n", r.Records, r.Events, r.OutOfOrder)
	}
	return err
}
