package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/outboxrelay/relay/relay"
)

func deadLettersCommand() *command {
	return group("dead-letters", "list, show, retry or discard events that could not be published",
		&command{name: "list", summary: "list dead letters (unresolved ones unless --resolved)", run: deadLettersList, readOnly: true},
		&command{name: "show", summary: "show one dead letter whole: relay dead-letters show ID", run: deadLettersShow, readOnly: true},
		&command{name: "retry", summary: "put events back into the outbox with their original event ids: ids, or filters", run: deadLettersRetry},
		&command{name: "discard", summary: "mark dead letters discarded, with --note: ids, or filters", run: deadLettersDiscard})
}

// deadLetterFlags are the filters the dead-letter commands share.
type deadLetterFlags struct {
	db       dbFlags
	events   eventFlags
	reason   string
	asJSON   bool
	resolved bool
	limit    int
	all      bool
	note     string
}

func (f *deadLetterFlags) register(fs *flag.FlagSet, action string) {
	f.db.register(fs)
	f.events.register(fs, "dead letters", "that failed")
	fs.StringVar(&f.reason, "reason", "", "only this reason: invalid_topic, invalid_headers, too_large, sink_rejected, schema_invalid, cloudevents_unwrappable, held")
	fs.BoolVar(&f.asJSON, "json", false, "print JSON")
	switch action {
	case "list":
		fs.BoolVar(&f.resolved, "resolved", false, "include dead letters already retried or discarded")
		fs.IntVar(&f.limit, "limit", 100, "most dead letters listed")
	case "retry", "discard":
		fs.BoolVar(&f.all, "all", false, "act on every unresolved dead letter (needed when no id or filter is given)")
	}
	if action == "discard" {
		fs.StringVar(&f.note, "note", "", "why they are discarded (required; kept with the record)")
	}
}

func (f *deadLetterFlags) filter(fs *flag.FlagSet) (relay.DeadLetterFilter, error) {
	ef, err := f.events.filter(fs, time.Now())
	if err != nil {
		return relay.DeadLetterFilter{}, err
	}
	df := relay.DeadLetterFilter{Topic: ef.topic, Key: ef.key, Since: ef.since, Until: ef.until, Reason: f.reason, Resolved: f.resolved}
	for _, a := range fs.Args() {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return df, usagef("%q is not a dead-letter id", a)
		}
		df.IDs = append(df.IDs, id)
	}
	return df, nil
}

// deadLetterCommand parses a dead-letter command's flags and runs do with
// a connection and the filter.
func deadLetterCommand(ctx context.Context, stdio IO, args []string, action string,
	do func(ctx context.Context, conn relay.Beginner, db relay.DB, f *deadLetterFlags, df relay.DeadLetterFilter) error) error {
	var f deadLetterFlags
	fs := flagSet("relay dead-letters "+action, stdio)
	f.register(fs, action)
	if err := parse(fs, args, stdio, action != "list"); err != nil {
		return err
	}
	df, err := f.filter(fs)
	if err != nil {
		return err
	}
	conn, _, err := f.db.connect(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return do(ctx, conn, conn, &f, df)
}

func deadLettersList(ctx context.Context, stdio IO, args []string) error {
	return deadLetterCommand(ctx, stdio, args, "list", func(ctx context.Context, _ relay.Beginner, db relay.DB, f *deadLetterFlags, df relay.DeadLetterFilter) error {
		if f.limit < 1 {
			return usagef("--limit must be positive")
		}
		ds, err := relay.ListDeadLetters(ctx, db, f.db.schema, df, f.limit)
		if err != nil {
			return err
		}
		if f.asJSON {
			return writeJSON(stdio.Stdout, ds)
		}
		tw := tabwriter.NewWriter(stdio.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tFAILED AT\tREASON\tTOPIC\tKEY\tEVENT ID\tSTATE\tERROR")
		for _, d := range ds {
			state := deadLetterState(d)
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, d.FailedAt.UTC().Format(time.RFC3339), d.Reason,
				clip(d.Topic, 40), clip(deref(d.Key), 30), d.EventID, state, clip(d.Error, 80))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(ds) == f.limit {
			fmt.Fprintf(stdio.Stderr, "(the first %d; --limit shows more)\n", f.limit)
		}
		return nil
	})
}

func deadLettersShow(ctx context.Context, stdio IO, args []string) error {
	return deadLetterCommand(ctx, stdio, args, "show", func(ctx context.Context, _ relay.Beginner, db relay.DB, f *deadLetterFlags, df relay.DeadLetterFilter) error {
		if len(df.IDs) != 1 {
			return usagef("relay dead-letters show takes one id")
		}
		d, err := relay.GetDeadLetter(ctx, db, f.db.schema, df.IDs[0])
		if err != nil {
			return err
		}
		if f.asJSON {
			return writeJSON(stdio.Stdout, d)
		}
		printDeadLetter(stdio.Stdout, d)
		return nil
	})
}

func printDeadLetter(w io.Writer, d relay.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "id\t%d\n", d.ID)
	fmt.Fprintf(tw, "event id\t%s\n", d.EventID)
	fmt.Fprintf(tw, "outbox row\t%d\n", d.EventRowID)
	fmt.Fprintf(tw, "topic\t%s\n", d.Topic)
	fmt.Fprintf(tw, "key\t%s\n", orNull(d.Key))
	fmt.Fprintf(tw, "headers\t%s\n", orNull(d.Headers))
	fmt.Fprintf(tw, "created at\t%s\n", d.CreatedAt.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "failed at\t%s\n", d.FailedAt.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "reason\t%s\n", d.Reason)
	fmt.Fprintf(tw, "error\t%s\n", d.Error)
	switch {
	case d.Resolution == "":
		fmt.Fprintf(tw, "state\t%s\n", deadLetterState(d))
	case d.ResolvedAt != nil:
		fmt.Fprintf(tw, "state\t%s at %s\n", deadLetterState(d), d.ResolvedAt.UTC().Format(time.RFC3339))
	}
	if d.Note != "" {
		fmt.Fprintf(tw, "note\t%s\n", d.Note)
	}
	switch {
	case d.Payload == nil:
		fmt.Fprintf(tw, "payload\tNULL (a tombstone)\n")
	case utf8.Valid(d.Payload):
		fmt.Fprintf(tw, "payload\t%d bytes: %s\n", len(d.Payload), clip(string(d.Payload), 4096))
	default:
		fmt.Fprintf(tw, "payload\t%d bytes, not UTF-8 (--json shows them in base64)\n", len(d.Payload))
	}
	tw.Flush()
}

func deadLettersRetry(ctx context.Context, stdio IO, args []string) error {
	return deadLetterCommand(ctx, stdio, args, "retry", func(ctx context.Context, conn relay.Beginner, _ relay.DB, f *deadLetterFlags, df relay.DeadLetterFilter) error {
		n, err := relay.RetryDeadLetters(ctx, conn, f.db.schema, df, f.all)
		if err != nil {
			return noFilterUsage(err)
		}
		return report(stdio, f.asJSON, "retried", n, "put back into the outbox with their original event ids (one that holds its key is published by the leader, then the events held behind it)")
	})
}

func deadLettersDiscard(ctx context.Context, stdio IO, args []string) error {
	return deadLetterCommand(ctx, stdio, args, "discard", func(ctx context.Context, _ relay.Beginner, db relay.DB, f *deadLetterFlags, df relay.DeadLetterFilter) error {
		if strings.TrimSpace(f.note) == "" {
			return usagef("--note is required: say why these events are given up")
		}
		n, err := relay.DiscardDeadLetters(ctx, db, f.db.schema, df, f.all, f.note)
		if err != nil {
			return noFilterUsage(err)
		}
		return report(stdio, f.asJSON, "discarded", n, "marked discarded; their rows stay as the record (the events held behind one are published by the leader)")
	})
}

// deadLetterState names what became of a dead letter, and whether it holds
// its key (the hold-key policy) or is held behind another.
func deadLetterState(d relay.DeadLetter) string {
	switch {
	case d.HeldBy != nil && d.Resolution == "":
		return fmt.Sprintf("held behind row %d", *d.HeldBy)
	case d.Holds && d.Resolution == "":
		return "unresolved, holds its key"
	case d.Holds:
		return d.Resolution + ", releasing its key"
	case d.Resolution == "":
		return "unresolved"
	}
	return d.Resolution
}

func noFilterUsage(err error) error {
	if errors.Is(err, relay.ErrNoFilter) {
		return usagef("%v", err)
	}
	return err
}

func report(stdio IO, asJSON bool, what string, n int64, detail string) error {
	if asJSON {
		return writeJSON(stdio.Stdout, map[string]int64{what: n})
	}
	fmt.Fprintf(stdio.Stdout, "%d dead letters %s\n", n, detail)
	return nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func orNull(s *string) string {
	if s == nil {
		return "NULL"
	}
	return *s
}
