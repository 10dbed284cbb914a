package cli

import (
	"context"

	"github.com/outboxrelay/relay/internal/broker"
)

func logCommand() *command {
	return group("log", "read the embedded broker's files",
		&command{name: "dump", summary: "print records from the log files (read-only, safe while the daemon runs)", run: logDump, readOnly: true})
}

func logDump(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay log dump", stdio)
	var opts broker.DumpOptions
	fs.StringVar(&opts.DataDir, "data-dir", "relay-data", "embedded broker data directory")
	fs.StringVar(&opts.Topic, "topic", "", "only this topic (default: all)")
	partition := fs.Int("partition", -1, "only this partition (default: all)")
	fs.Int64Var(&opts.FromOffset, "from-offset", 0, "skip records below this offset")
	fs.StringVar(&opts.Format, "format", "text", "text, or json (one object per line)")
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	if opts.Format != "text" && opts.Format != "json" {
		return usagef("--format %q: must be text or json", opts.Format)
	}
	opts.Partition = int32(*partition)
	return broker.Dump(ctx, stdio.Stdout, opts)
}
