package devcli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/outboxrelay/relay/internal/bench"
	"github.com/outboxrelay/relay/internal/cli"
)

func runBench(ctx context.Context, stdio cli.IO, args []string) error {
	if len(args) > 0 && args[0] == "broker" {
		return runBrokerBench(ctx, stdio, args[1:])
	}
	if len(args) > 0 && args[0] == "bigtx" {
		return runBigTxBench(ctx, stdio, args[1:])
	}
	fs := cli.FlagSet("relay-dev bench", stdio)
	var cfg bench.Config
	fs.StringVar(&cfg.DatabaseURL, "database-url", "", "PostgreSQL server to use (default: start a throwaway one from the local binaries)")
	fs.StringVar(&cfg.Source, "source", "poll", "reader: poll or cdc")
	fs.StringVar(&cfg.Sink, "sink", "embedded", "destination: embedded, or kafka (an in-process kfake cluster, or yours with --relay-args '--kafka-brokers host:port --kafka-create-topics')")
	fs.IntVar(&cfg.Events, "events", 100_000, "events to write")
	fs.IntVar(&cfg.Writers, "writers", 4, "concurrent writers")
	fs.IntVar(&cfg.Keys, "keys", 1000, "distinct keys (at most 10,000,000)")
	fs.IntVar(&cfg.PayloadBytes, "payload-bytes", 200, "payload size")
	fs.BoolVar(&cfg.PayloadMix, "payload-mix", false, "payload sizes log-uniform between 100 B and 1,000,000 B (mean about 109 KB, median 10 KB) instead of --payload-bytes")
	fs.IntVar(&cfg.Topics, "topics", 1, "spread the events over this many topics (bench-0 ..; 1: the topic bench)")
	fs.IntVar(&cfg.Partitions, "partitions", 0, "the relay's --partitions: partition count of the topics it creates (0: the relay's default)")
	fs.IntVar(&cfg.Consumers, "consumers", 0, "with --backlog and the embedded sink, read the drained events back through the relay's Kafka listener: 1 consumer assigned every partition, or a group of this many")
	fs.IntVar(&cfg.Rate, "rate", 0, "open-loop write rate in events/s across all writers (0: as fast as possible)")
	fs.IntVar(&cfg.EventsPerTx, "events-per-tx", 0, "events per writer transaction (default 1 live, 1000 with --backlog)")
	fs.BoolVar(&cfg.Backlog, "backlog", false, "write everything first, then start the relay (replay after an outage)")
	fs.BoolVar(&cfg.CommitTimestamps, "commit-timestamps", false, "run the throwaway PostgreSQL with track_commit_timestamp on (always with --source cdc): the poll reader then orders by commit timestamp")
	fs.BoolVar(&cfg.LongTx, "long-tx", false, "live: hold a writing transaction open in another database of the cluster for the whole run, and report the latencies during it")
	fs.BoolVar(&cfg.Schema, "schema-validation", false, "with --backlog: drain backlogs of JSON and of Avro payloads with schema validation off and on (a contract and the wire format), and report on/off per format")
	fs.BoolVar(&cfg.Tracing, "tracing", false, "write every event with a traceparent and measure each run twice: the relay's tracing off, then on (OTLP/HTTP to a receiver in the bench); no baseline")
	baseline := fs.Bool("baseline", true, "with --backlog, also run the baseline on the same data")
	var child childRelay
	child.register(fs)
	fs.IntVar(&cfg.Runs, "runs", 1, "repeat the measurement this many times in the same environment and report each and the median")
	fs.DurationVar(&cfg.Window, "window", 0, "live: log the latency p50 / p99 of each such interval alone, with PostgreSQL's checkpoints, autovacuums and WAL bytes per event in it (0: off)")
	fs.DurationVar(&cfg.IdleRSS, "idle-rss", 0, "with --backlog: keep the relay idle this long after the drain (and the read-back of --consumers), then report its resident set (0: off)")
	fs.IntVar(&cfg.Restarts, "restarts", 0, "with --backlog: stop the relay cleanly after the drain, start it this many times over the same data, and report each start's time from exec to /readyz 200")
	asJSON := fs.Bool("json", false, "print JSON instead of a table (an array with --runs above 1)")
	if err := cli.Parse(fs, args, stdio); err != nil {
		return err
	}
	cfg.Baseline = *baseline && !cfg.Tracing
	var err error
	if cfg.RelayBinary, cfg.RelayArgs, err = child.relay(); err != nil {
		return err
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stdio.Stderr, nil))
	results, err := bench.Run(ctx, cfg)
	if err != nil && (len(results) == 0 || !results[len(results)-1].Interrupted) {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdio.Stdout)
		enc.SetIndent("", "  ")
		if len(results) == 1 {
			return enc.Encode(results[0])
		}
		return enc.Encode(results)
	}
	printBench(stdio.Stdout, results)
	return nil
}

// childRelay holds the flags of the benches that run the relay as a
// child process: which executable, and extra `relay run` flags.
type childRelay struct {
	binary, args string
}

func (c *childRelay) register(fs *flag.FlagSet) {
	fs.StringVar(&c.binary, "relay-binary", "", "run this executable's `run` command as the relay (default: this binary), to compare builds with one bench")
	fs.StringVar(&c.args, "relay-args", "", "extra `relay run` flags, space-separated")
}

// relay is the executable to run as the relay, --relay-binary or by
// default this binary (whose `relay-dev run` is the relay's `relay run`),
// and the extra flags. It fails when this binary's path is unknown.
func (c *childRelay) relay() (binary string, args []string, err error) {
	args = strings.Fields(c.args)
	if c.binary != "" {
		return c.binary, args, nil
	}
	exe, err := os.Executable()
	return exe, args, err
}

func printBench(w io.Writer, results []bench.Result) {
	for _, r := range results {
		if r.Interrupted {
			fmt.Fprintln(w, "interrupted: figures cover the part that ran")
		}
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
	fmt.Fprintf(tw, "mode\tsource\tsink\ttopics\tpayload\tevents\twritten/s\tpublished/s\tlatency from\tp50\tp90\tp99\tmax\trelay RSS peak\trelay CPU\tCPU/event\trelay open files\t\n")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d B\t%d\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%.1f MiB\t%.1f s\t%.1f us\t%d\t\n",
			r.Mode, r.Source, r.Sink, r.Topics, r.PayloadBytes, r.Published, r.WriteRate, r.PublishRate, r.LatencyFrom,
			ms(r.LatencyP50), ms(r.LatencyP90), ms(r.LatencyP99), ms(r.LatencyMax),
			float64(r.RSSPeakBytes)/(1<<20), r.CPUSeconds, r.CPUPerEvent, r.OpenFiles)
	}
	tw.Flush()
	for _, r := range results {
		if c := r.Consume; c != nil {
			kind := "one consumer"
			if c.Group {
				kind = fmt.Sprintf("a group of %d", c.Consumers)
			}
			fmt.Fprintf(w, "read back through the Kafka listener, %s: %d records in %.2f s (first after %.2f s), %.0f records/s, %.1f MiB/s\n",
				kind, c.Records, c.Seconds, c.FirstRecordSeconds, c.Rate, c.MiBPerSec)
		}
	}
	if slices.ContainsFunc(results, func(r bench.Result) bool { return r.Arrived > 0 }) {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "arrival in the cluster (the bench's consumer)\tfrom\tevents\tp50\tp90\tp99\tmax\trelay CPU/event\t\n")
		for _, r := range results {
			fmt.Fprintf(tw, "%s %s\t%s\t%d\t%s\t%s\t%s\t%s\t%.1f us\t\n", r.Mode, r.Source, r.ArrivalFrom, r.Arrived,
				ms(r.ArrivalP50), ms(r.ArrivalP90), ms(r.ArrivalP99), ms(r.ArrivalMax), r.CPUPerEvent)
		}
		tw.Flush()
	}
	for _, r := range results {
		if r.IdleRSSBytes > 0 {
			fmt.Fprintf(w, "relay RSS: idle %.1f MiB after the drain (anonymous %.1f MiB, the rest mapped files: the executable), peak %.1f MiB while draining (%d partitions)\n",
				float64(r.IdleRSSBytes)/(1<<20), float64(r.IdleAnonRSSBytes)/(1<<20), float64(r.RSSPeakBytes)/(1<<20), r.Partitions)
		}
		if len(r.ReadySeconds) > 0 {
			s := slices.Sorted(slices.Values(r.ReadySeconds))
			fmt.Fprintf(w, "start to ready after a clean stop, %d starts: median %.3f s, min %.3f, max %.3f\n", len(s), median(s), s[0], s[len(s)-1])
		}
	}
	var ratios []float64
	schemaRatios := map[string][]float64{}
	var formats []string
	for _, r := range results {
		if s := r.Schema; s != nil {
			for _, f := range s.Formats {
				fmt.Fprintf(w, "schema validation, %s (%d-byte payloads): off %.0f events/s, on %.0f events/s; on/off = %.2f (relay CPU per event: off %.1f us, on %.1f us)\n",
					f.Format, f.PayloadBytes, f.OffRate, f.OnRate, f.Ratio, f.OffCPU, f.OnCPU)
				if schemaRatios[f.Format] == nil {
					formats = append(formats, f.Format)
				}
				schemaRatios[f.Format] = append(schemaRatios[f.Format], f.Ratio)
			}
		}
	}
	for _, f := range formats {
		if rs := schemaRatios[f]; len(rs) > 1 {
			slices.Sort(rs)
			fmt.Fprintf(w, "schema validation, %s, on/off over %d runs: median %.2f, min %.2f, max %.2f\n", f, len(rs), median(rs), rs[0], rs[len(rs)-1])
		}
	}
	for _, r := range results {
		if b := r.Baseline; b != nil {
			fmt.Fprintf(w, "baseline: %s: %.0f events/s; relay/baseline = %.2f (relay CPU per event %.1f us)\n", b.Name, b.Rate, b.Ratio, r.CPUPerEvent)
			ratios = append(ratios, b.Ratio)
		}
	}
	if len(ratios) > 1 {
		slices.Sort(ratios)
		fmt.Fprintf(w, "relay/baseline over %d runs: median %.2f, min %.2f, max %.2f\n", len(ratios), median(ratios), ratios[0], ratios[len(ratios)-1])
	}
	if len(results) > 1 && strings.HasPrefix(results[0].Mode, "live") {
		p99 := make([]float64, len(results))
		for i, r := range results {
			p99[i] = float64(r.LatencyP99) / float64(time.Millisecond)
		}
		slices.Sort(p99)
		fmt.Fprintf(w, "p99 over %d runs: median %.2f ms, min %.2f, max %.2f\n", len(p99), median(p99), p99[0], p99[len(p99)-1])
	}
}

// median of sorted values.
func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}
