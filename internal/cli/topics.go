package cli

import (
	"context"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/outboxrelay/relay/internal/broker"
)

func topicsCommand() *command {
	return &command{name: "topics", summary: "list the embedded broker's topics (read-only, safe while the daemon runs); create, alter, describe, delete one",
		run: topics, sub: topicAdminCommands(), readOnly: true}
}

type topicJSON struct {
	Name              string          `json:"name"`
	Partitions        []partitionJSON `json:"partitions"`
	RetentionMs       int64           `json:"retention_ms"`
	RetentionBytes    int64           `json:"retention_bytes"`
	CleanupPolicy     string          `json:"cleanup_policy"`
	SegmentBytes      int64           `json:"segment_bytes"`
	MaxMessageBytes   int32           `json:"max_message_bytes"`
	DeleteRetentionMs int64           `json:"delete_retention_ms"`
}

type partitionJSON struct {
	Partition   int32 `json:"partition"`
	StartOffset int64 `json:"start_offset"`
	EndOffset   int64 `json:"end_offset"`
	Bytes       int64 `json:"bytes"`
	Segments    int   `json:"segments"`
	// Skew is the partition's records ever appended (its end offset)
	// over the mean of its topic's partitions: 1 is an even share, a hot
	// partition (a skewed key) stands above; 0 when the topic is empty.
	Skew float64 `json:"skew"`
	// Lost are the offset ranges the broker found damaged or missing.
	Lost []broker.LostRange `json:"lost,omitempty"`
}

// inspect registers --data-dir (described by dataDirUsage) and --json on
// fs, beside the command's own flags, parses args and reads the embedded
// broker's files: what `relay topics` and `relay groups` show.
func inspect(ctx context.Context, stdio IO, fs *flag.FlagSet, args []string, dataDirUsage string) (ins broker.Inspection, asJSON bool, err error) {
	dataDir := fs.String("data-dir", "relay-data", dataDirUsage)
	j := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args, stdio, false); err != nil {
		return ins, false, err
	}
	ins, err = broker.Inspect(ctx, *dataDir)
	return ins, *j, err
}

func topics(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay topics", stdio)
	ins, asJSON, err := inspect(ctx, stdio, fs, args, "embedded broker data directory")
	if err != nil {
		return err
	}
	out := make([]topicJSON, 0, len(ins.Topics))
	for _, t := range ins.Topics {
		tj := topicJSON{Name: t.Name, RetentionMs: t.Config.RetentionMs, RetentionBytes: t.Config.RetentionBytes,
			CleanupPolicy: string(t.Config.CleanupPolicy), SegmentBytes: t.Config.SegmentBytes,
			MaxMessageBytes: t.Config.MaxMessageBytes, DeleteRetentionMs: t.Config.DeleteRetentionMs, Partitions: []partitionJSON{}}
		var appended int64
		for _, p := range t.Partitions {
			appended += p.LogEndOffset
		}
		for _, p := range t.Partitions {
			var skew float64
			if appended > 0 {
				skew = float64(p.LogEndOffset) * float64(len(t.Partitions)) / float64(appended)
			}
			tj.Partitions = append(tj.Partitions, partitionJSON{Partition: p.Partition, StartOffset: p.LogStartOffset,
				EndOffset: p.LogEndOffset, Bytes: p.Bytes, Segments: p.Segments, Skew: skew, Lost: p.Lost})
		}
		out = append(out, tj)
	}
	if asJSON {
		return writeJSON(stdio.Stdout, out)
	}
	if len(out) == 0 {
		fmt.Fprintln(stdio.Stdout, "no topics")
		return nil
	}
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "TOPIC\tPARTITION\tSTART\tEND\tRECORDS\tBYTES\tSEGMENTS\tSKEW\tRETENTION\tCLEANUP\t")
	for _, t := range out {
		for _, p := range t.Partitions {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.2fx\t%s\t%s\t\n", t.Name, p.Partition, p.StartOffset, p.EndOffset,
				p.EndOffset-p.StartOffset, p.Bytes, p.Segments, p.Skew, retention(t.RetentionMs, t.RetentionBytes), t.CleanupPolicy)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, t := range out {
		for _, p := range t.Partitions {
			for _, l := range p.Lost {
				fmt.Fprintf(stdio.Stdout, "LOST %s/%d offsets %d to %d (%d records): %s\n", t.Name, p.Partition, l.First, l.Last, l.Records(), l.Reason)
			}
		}
	}
	return nil
}

func retention(ms, bytes int64) string {
	s := "forever"
	if ms >= 0 {
		s = (time.Duration(ms) * time.Millisecond).String()
	}
	if bytes >= 0 {
		s += fmt.Sprintf(" or %d bytes", bytes)
	}
	return s
}
