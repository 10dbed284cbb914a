package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/relay"
)

func replayCommand() *command {
	return &command{name: "replay", summary: "republish retained events (the running leader does the work)", run: replay}
}

type replayFlags struct {
	db        dbFlags
	events    eventFlags
	fromEvent string
	dryRun    bool
	detach    bool
	json      bool
	poll      time.Duration
}

func (f *replayFlags) filter(fs *flag.FlagSet, now time.Time) (relay.ReplayFilter, error) {
	if (f.events.since == "") == (f.fromEvent == "") {
		return relay.ReplayFilter{}, usagef("give exactly one of --since or --from-event")
	}
	ef, err := f.events.filter(fs, now)
	if err != nil {
		return relay.ReplayFilter{}, err
	}
	rf := relay.ReplayFilter{Since: ef.since, Until: ef.until, FromEvent: f.fromEvent, Topic: ef.topic, Key: ef.key}
	if rf.Topic != "" {
		if err := relay.ValidTopic(rf.Topic); err != nil {
			return rf, usagef("--topic: %v", err)
		}
	}
	if err := rf.Validate(); err != nil {
		return rf, usagef("%v", err)
	}
	return rf, nil
}

func replay(ctx context.Context, stdio IO, args []string) error {
	var f replayFlags
	fs := flagSet("relay replay", stdio)
	f.db.register(fs)
	f.events.register(fs, "events", "created")
	fs.StringVar(&f.fromEvent, "from-event", "", "replay from this event id on, in publication order")
	fs.BoolVar(&f.dryRun, "dry-run", false, "count what would be replayed, change nothing")
	fs.BoolVar(&f.detach, "detach", false, "record the request and exit without waiting for it")
	fs.BoolVar(&f.json, "json", false, "print the outcome as JSON")
	fs.DurationVar(&f.poll, "poll-interval", 500*time.Millisecond, "how often progress is read")
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	filter, err := f.filter(fs, time.Now())
	if err != nil {
		return err
	}
	conn, err := pgconfig.Connect(ctx, f.db.url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))

	if f.dryRun {
		n, err := relay.CountReplay(ctx, conn, f.db.schema, filter)
		if err != nil {
			return err
		}
		if f.json {
			return writeJSON(stdio.Stdout, map[string]any{"dry_run": true, "filter": filter, "events": n})
		}
		fmt.Fprintf(stdio.Stdout, "dry run: %d retained events match; nothing was replayed\n", n)
		return nil
	}
	id, err := relay.RequestReplay(ctx, conn, f.db.schema, filter)
	if err != nil {
		return err
	}
	if f.detach {
		if f.json {
			return writeJSON(stdio.Stdout, map[string]any{"id": id, "status": relay.ReplayPending})
		}
		fmt.Fprintf(stdio.Stdout, "replay request %d recorded; the leader executes it (follow it with relay status)\n", id)
		return nil
	}
	if !f.json {
		fmt.Fprintf(stdio.Stderr, "replay request %d recorded; waiting for the leader (Ctrl-C cancels)\n", id)
	}
	q, err := followReplay(ctx, stdio, conn, f.db.schema, id, f.poll, !f.json && isTerminal(stdio.Stderr))
	if ctx.Err() != nil {
		// Ctrl-C: cancel the request; what is republished stays.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, cerr := relay.CancelReplay(cctx, conn, f.db.schema, id); cerr != nil {
			return fmt.Errorf("cancelling replay request %d: %w", id, cerr)
		}
		q, err = relay.GetReplay(cctx, conn, f.db.schema, id)
	}
	if err != nil {
		return err
	}
	if f.json {
		if werr := writeJSON(stdio.Stdout, q); werr != nil {
			return werr
		}
	} else {
		reportReplay(stdio.Stdout, q)
	}
	switch q.Status {
	case relay.ReplayDone:
		return nil
	case relay.ReplayFailed:
		return fmt.Errorf("replay request %d failed: %s", id, q.Error)
	default:
		return fmt.Errorf("replay request %d %s after %d events", id, q.Status, q.Done)
	}
}

// followReplay polls the request until it finishes or ctx ends, drawing a
// progress line when tty is set.
func followReplay(ctx context.Context, stdio IO, db relay.DB, schema string, id int64, every time.Duration, tty bool) (relay.ReplayRequest, error) {
	t := time.NewTicker(every)
	defer t.Stop()
	type sample struct {
		at   time.Time
		done int64
	}
	var window []sample
	drawn := false
	defer func() {
		if drawn {
			fmt.Fprintln(stdio.Stderr)
		}
	}()
	for {
		q, err := relay.GetReplay(ctx, db, schema, id)
		if err != nil {
			return q, err
		}
		if q.Finished() {
			return q, nil
		}
		now := time.Now()
		window = append(window, sample{now, q.Done})
		for len(window) > 1 && now.Sub(window[0].at) > 10*time.Second {
			window = window[1:]
		}
		if tty {
			fmt.Fprintf(stdio.Stderr, "\r\033[K%s", progressLine(q, window[0].at, window[0].done, now))
			drawn = true
		}
		select {
		case <-ctx.Done():
			return q, ctx.Err()
		case <-t.C:
		}
	}
}

func progressLine(q relay.ReplayRequest, since time.Time, doneThen int64, now time.Time) string {
	if q.Status == relay.ReplayPending {
		return fmt.Sprintf("replay %d: pending, waiting for the leader (is relay run running?)", q.ID)
	}
	total := int64(0)
	if q.Total != nil {
		total = *q.Total
	}
	line := fmt.Sprintf("replay %d: %d/%d", q.ID, q.Done, total)
	if total > 0 {
		line += fmt.Sprintf(" (%.0f%%)", 100*float64(q.Done)/float64(total))
	}
	if dt := now.Sub(since).Seconds(); dt > 0 {
		rate := float64(q.Done-doneThen) / dt
		line += fmt.Sprintf("  %.0f events/s", rate)
		if rate > 0 && total > q.Done {
			line += "  ETA " + (time.Duration(float64(total-q.Done)/rate) * time.Second).Round(time.Second).String()
		}
	}
	return line
}

func reportReplay(w io.Writer, q relay.ReplayRequest) {
	took := ""
	if q.StartedAt != nil && q.FinishedAt != nil {
		took = " in " + q.FinishedAt.Sub(*q.StartedAt).Round(time.Millisecond).String()
	}
	total := "?"
	if q.Total != nil {
		total = fmt.Sprint(*q.Total)
	}
	switch q.Status {
	case relay.ReplayDone:
		fmt.Fprintf(w, "replay %d done: republished %d of %d matching events%s\n", q.ID, q.Done, *q.Total, took)
	case relay.ReplayFailed:
		fmt.Fprintf(w, "replay %d failed after %d of %s events: %s\n", q.ID, q.Done, total, q.Error)
	default:
		fmt.Fprintf(w, "replay %d %s: republished %d of %s events%s\n", q.ID, q.Status, q.Done, total, took)
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
