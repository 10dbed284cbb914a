package cli

import (
	"flag"
	"strings"
	"time"
)

// eventFlags are the --topic, --key, --since and --until filters of the
// commands that pick events out of a table: dead letters by when they
// failed, replays by when the events were created.
type eventFlags struct {
	topic, key, since, until string
}

// register adds the flags to fs; events names what they pick ("dead
// letters"), happened the moment of theirs the times bound ("that failed").
func (f *eventFlags) register(fs *flag.FlagSet, events, happened string) {
	fs.StringVar(&f.topic, "topic", "", "only "+events+" of this topic")
	fs.StringVar(&f.key, "key", "", "only "+events+" with this key")
	fs.StringVar(&f.since, "since", "", "only "+events+" "+happened+" at or after this time (RFC 3339, or a duration ago such as 15m)")
	fs.StringVar(&f.until, "until", "", "only "+events+" "+happened+" before this time (RFC 3339, or a duration ago)")
}

// eventFilter is what eventFlags pick: a nil key or time is no filter.
type eventFilter struct {
	topic        string
	key          *string
	since, until *time.Time
}

// filter reads the flags of fs, already parsed, with durations counted
// back from now. --key picks its value even when that is empty.
func (f *eventFlags) filter(fs *flag.FlagSet, now time.Time) (eventFilter, error) {
	ef := eventFilter{topic: f.topic}
	fs.Visit(func(fl *flag.Flag) {
		if fl.Name == "key" {
			ef.key = &f.key
		}
	})
	var err error
	if ef.since, err = parseTime("--since", f.since, now); err != nil {
		return ef, err
	}
	if ef.until, err = parseTime("--until", f.until, now); err != nil {
		return ef, err
	}
	return ef, nil
}

// parseTime reads an RFC 3339 time, or a duration meaning that long ago.
func parseTime(flag, v string, now time.Time) (*time.Time, error) {
	if v == "" {
		return nil, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return &t, nil
	}
	if d, err := time.ParseDuration(strings.TrimPrefix(v, "-")); err == nil && d >= 0 {
		t := now.Add(-d)
		return &t, nil
	}
	return nil, usagef("%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or a duration ago (15m)", flag, v)
}
