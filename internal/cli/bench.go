package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxrelay/relay/internal/bench"
)

func benchCommand() *command {
	return &command{name: "bench", summary: "measure the relay end to end against its baseline", run: runBench}
}

func runBench(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay bench", stdio)
	var cfg bench.Config
	fs.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL server to use (default: start a throwaway one from the local binaries)")
	fs.StringVar(&cfg.Source, "source", "poll", "reader: poll or cdc")
	fs.StringVar(&cfg.Sink, "sink", "embedded", "destination: embedded, or kafka (give the cluster with --relay-args '--kafka-brokers host:port --kafka-create-topics')")
	fs.IntVar(&cfg.Events, "events", 100_000, "events to write")
	fs.IntVar(&cfg.Writers, "writers", 4, "concurrent writers")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct keys")
	fs.IntVar(&cfg.PayloadBytes, "payload-bytes", 200, "payload size")
	fs.IntVar(&cfg.Rate, "rate", 0, "open-loop write rate in events/s across all writers (0: as fast as possible)")
	fs.IntVar(&cfg.EventsPerTx, "events-per-tx", 0, "events per writer transaction (default 1 live, 1000 with --backlog)")
	fs.BoolVar(&cfg.Backlog, "backlog", false, "write everything first, then start the relay (replay after an outage)")
	baseline := fs.Bool("baseline", true, "with --backlog, also run the baseline on the same data")
	relayArgs := fs.String("relay-args", "", "extra `relay run` flags, space-separated")
	asJSON := fs.Bool("json", false, "print JSON instead of a table")
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	cfg.Baseline = *baseline
	cfg.RelayArgs = strings.Fields(*relayArgs)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cfg.RelayBinary = exe
	cfg.Logger = (&runFlags{logFormat: "text", logLevel: "info"}).logger(stdio)
	res, err := bench.Run(ctx, cfg)
	if err != nil && !res.Interrupted {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdio.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(res)
	}
	printBench(stdio.Stdout, res)
	return nil
}

func printBench(w io.Writer, r bench.Result) {
	if r.Interrupted {
		fmt.Fprintln(w, "interrupted: figures cover the part that ran")
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
	fmt.Fprintf(tw, "mode\tsource\tsink\tevents\twritten/s\tpublished/s\tlatency from\tp50\tp90\tp99\tmax\trelay RSS peak\trelay CPU\t\n")
	fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%.1f MiB\t%.1f s\t\n",
		r.Mode, r.Source, r.Sink, r.Published, r.WriteRate, r.PublishRate, r.LatencyFrom,
		ms(r.LatencyP50), ms(r.LatencyP90), ms(r.LatencyP99), ms(r.LatencyMax),
		float64(r.RSSPeakBytes)/(1<<20), r.CPUSeconds)
	tw.Flush()
	if b := r.Baseline; b != nil {
		fmt.Fprintf(w, "baseline: %s: %.0f events/s; relay/baseline = %.2f\n", b.Name, b.Rate, b.Ratio)
	}
}
