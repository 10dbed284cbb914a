package cli

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func groupsCommand() *command {
	return &command{name: "groups", summary: "list consumer and share groups: members, committed offsets (share groups: start offsets and records in flight), lag, lag against retention", run: groups, readOnly: true}
}

type groupJSON struct {
	Group string `json:"group"`
	// Type is "share" for a share group (KIP-932), empty for a consumer
	// group.
	Type string `json:"type,omitempty"`
	// State and Members come from the Kafka listener (--kafka-addr); they
	// are absent when it does not answer.
	State      string           `json:"state,omitempty"`
	Members    []memberJSON     `json:"members"`
	Partitions []groupPartition `json:"partitions"`
	// Lag sums the partitions' lag.
	Lag int64 `json:"lag"`
}

type memberJSON struct {
	MemberID   string   `json:"member_id"`
	ClientID   string   `json:"client_id"`
	ClientHost string   `json:"client_host"`
	Assigned   []string `json:"assigned"`
}

type groupPartition struct {
	Topic       string `json:"topic"`
	Partition   int32  `json:"partition"`
	Committed   int64  `json:"committed"`
	StartOffset int64  `json:"start_offset"`
	EndOffset   int64  `json:"end_offset"`
	Lag         int64  `json:"lag"`
	// RetentionMargin is committed minus the log start: records retention
	// may still delete before the group loses unread ones.
	RetentionMargin int64     `json:"retention_margin"`
	BelowLogStart   bool      `json:"below_log_start"`
	CommittedAt     time.Time `json:"committed_at"`
	// InFlight (share groups) counts the records between the share
	// partition's start (Committed) and end offsets that are acquired or
	// waiting to be delivered again; Lag counts them too.
	InFlight int `json:"in_flight,omitempty"`
}

func groups(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay groups", stdio)
	kafkaAddr := fs.String("kafka-addr", "127.0.0.1:9092", "the daemon's Kafka listener, asked for live members (empty skips)")
	ins, asJSON, err := inspect(ctx, stdio, fs, args, "embedded broker data directory (read-only, safe while the daemon runs)")
	if err != nil {
		return err
	}
	out := make([]groupJSON, 0, len(ins.Groups))
	names := make([]string, 0, len(ins.Groups))
	for _, g := range ins.Groups {
		gj := groupJSON{Group: g.Group, Members: []memberJSON{}, Partitions: []groupPartition{}}
		for _, p := range g.Partitions {
			gj.Partitions = append(gj.Partitions, groupPartition{Topic: p.Topic, Partition: p.Partition, Committed: p.Committed,
				StartOffset: p.LogStartOffset, EndOffset: p.HighWatermark, Lag: p.Lag, RetentionMargin: p.RetentionMargin,
				BelowLogStart: p.BelowLogStart, CommittedAt: p.CommitTime.UTC()})
			gj.Lag += p.Lag
		}
		out = append(out, gj)
		names = append(names, g.Group)
	}
	if *kafkaAddr != "" && len(names) > 0 {
		describeMembers(ctx, *kafkaAddr, names, out)
	}
	shared, err := shareGroups(ctx, fs.Lookup("data-dir").Value.String(), *kafkaAddr, ins)
	if err != nil {
		return err
	}
	out = append(out, shared...)
	if asJSON {
		return writeJSON(stdio.Stdout, out)
	}
	if ins.OffsetsUnread > 0 {
		fmt.Fprintf(stdio.Stdout, "note: the last %d bytes of groups/offsets.log are no valid commit (one being written, or a torn or damaged tail, which the relay's next start sets aside)\n",
			ins.OffsetsUnread)
	}
	if len(out) == 0 {
		fmt.Fprintln(stdio.Stdout, "no consumer groups have committed offsets and no share groups have state")
		return nil
	}
	for i, g := range out {
		if i > 0 {
			fmt.Fprintln(stdio.Stdout)
		}
		state := g.State
		if state == "" {
			state = "unknown (Kafka listener not reachable)"
		}
		kind := "group"
		if g.Type == "share" {
			kind = "share group"
		}
		fmt.Fprintf(stdio.Stdout, "%s %s: %s, %d members, lag %d\n", kind, g.Group, state, len(g.Members), g.Lag)
		tw := tabwriter.NewWriter(stdio.Stdout, 0, 4, 2, ' ', 0)
		for _, m := range g.Members {
			fmt.Fprintf(tw, "  member %s\t%s@%s\t%s\n", m.MemberID, m.ClientID, m.ClientHost, strings.Join(m.Assigned, " "))
		}
		tw.Flush()
		tw = tabwriter.NewWriter(stdio.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
		if g.Type == "share" {
			fmt.Fprintln(tw, "  TOPIC\tPARTITION\tSHARE START\tIN FLIGHT\tSTART\tEND\tLAG\tRETENTION MARGIN\t")
			for _, p := range g.Partitions {
				fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t\n", p.Topic, p.Partition, p.Committed, p.InFlight, p.StartOffset, p.EndOffset, p.Lag, p.RetentionMargin)
			}
			tw.Flush()
			continue
		}
		fmt.Fprintln(tw, "  TOPIC\tPARTITION\tCOMMITTED\tSTART\tEND\tLAG\tRETENTION MARGIN\t")
		for _, p := range g.Partitions {
			margin := fmt.Sprint(p.RetentionMargin)
			if p.BelowLogStart {
				margin += " (lost records)"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%d\t%d\t%d\t%d\t%s\t\n", p.Topic, p.Partition, p.Committed, p.StartOffset, p.EndOffset, p.Lag, margin)
		}
		tw.Flush()
	}
	return nil
}

// describeMembers fills the live state and members of groups from the Kafka
// listener; a listener that does not answer leaves them empty.
func describeMembers(ctx context.Context, addr string, names []string, out []groupJSON) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTimeout(time.Second), kgo.RetryTimeout(2*time.Second))
	if err != nil {
		return
	}
	defer cl.Close()
	described, err := kadm.NewClient(cl).DescribeGroups(ctx, names...)
	if err != nil {
		return
	}
	for i := range out {
		d, ok := described[out[i].Group]
		if !ok || d.Err != nil {
			continue
		}
		out[i].State = d.State
		for _, m := range d.Members {
			mj := memberJSON{MemberID: m.MemberID, ClientID: m.ClientID, ClientHost: m.ClientHost, Assigned: []string{}}
			if c, ok := m.Assigned.AsConsumer(); ok {
				for _, t := range c.Topics {
					for _, p := range t.Partitions {
						mj.Assigned = append(mj.Assigned, fmt.Sprintf("%s/%d", t.Topic, p))
					}
				}
			}
			sort.Strings(mj.Assigned)
			out[i].Members = append(out[i].Members, mj)
		}
	}
}
