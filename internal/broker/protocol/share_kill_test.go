package protocol

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
)

const (
	shareKillTopic = "outbox-jobs"
	shareKillGroup = "job-workers"
	shareKillN     = 10000
)

// recID identifies a record by partition and offset.
type recID struct {
	part   int32
	offset int64
}

// shareMember consumes the share group with franz-go's share consumer and
// accepts every record. got is called for each record delivered; durable
// with the records of a round whose acceptance the broker answered
// without error (FlushAcks returned and the ack callback saw no error).
func shareMember(ctx context.Context, addr string, got func(recID), durable func([]recID)) error {
	var mu sync.Mutex
	failed := false
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(shareKillTopic), kgo.ShareGroup(shareKillGroup),
		kgo.ShareAckCallback(func(_ *kgo.Client, rs kgo.ShareAckResults) {
			if !rs.Ok() {
				mu.Lock()
				failed = true
				mu.Unlock()
			}
		}))
	if err != nil {
		return err
	}
	defer cl.Close()
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		var round []recID
		for _, r := range fs.Records() {
			id := recID{r.Partition, r.Offset}
			got(id)
			r.Ack(kgo.AckAccept)
			round = append(round, id)
		}
		if len(round) == 0 {
			continue
		}
		mu.Lock()
		failed = false
		mu.Unlock()
		if err := cl.FlushAcks(ctx); err != nil {
			continue
		}
		mu.Lock()
		ok := !failed
		mu.Unlock()
		if ok {
			durable(round)
		}
	}
	return nil
}

// runShareMemberProcess is the share-member helper process: it prints
// "durable p:o ..." after each durable round, and "redelivered p:o" if a
// record it durably accepted is delivered to it again.
func runShareMemberProcess(addr string) error {
	mine := map[recID]bool{}
	var mu sync.Mutex
	return shareMember(context.Background(), addr, func(id recID) {
		mu.Lock()
		defer mu.Unlock()
		if mine[id] {
			fmt.Printf("redelivered %d:%d\n", id.part, id.offset)
		}
	}, func(ids []recID) {
		mu.Lock()
		defer mu.Unlock()
		var b strings.Builder
		b.WriteString("durable")
		for _, id := range ids {
			mine[id] = true
			fmt.Fprintf(&b, " %d:%d", id.part, id.offset)
		}
		fmt.Println(b.String())
	})
}

// TestShareGroupSurvivesMemberAndRelayKills: two share members consume
// 10,000 records (with relay-event-id headers, as the outbox writes
// them); one member, a separate process, is SIGKILLed, then the broker
// process is SIGKILLed and restarted on its data directory, during
// consumption. Every record is accepted (the broker's saved share state
// ends at the log end with nothing in flight, and none went to the
// group's dead-letter topic), and no record is delivered again after a
// member's acceptance of it was answered.
func TestShareGroupSurvivesMemberAndRelayKills(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 40*time.Second)
	dir, addr := t.TempDir(), e2e.FreeAddr(t)
	brokerProc := startBrokerProcess(t, ctx, dir, addr)
	cl := newKgo(t, addr)
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopics(ctx, 2, 1, nil, shareKillTopic); err != nil {
		t.Fatal(err)
	}
	// A dead-letter topic catches any record archived other than by
	// acceptance (none may be): settled then means accepted.
	setShareConfigs(t, ctx, cl, shareKillGroup, "share.auto.offset.reset", "earliest", "share.record.lock.duration.ms", "2000",
		"errors.deadletterqueue.topic.name", "dlq.jobs")
	for i := range shareKillN {
		cl.Produce(ctx, &kgo.Record{Topic: shareKillTopic, Key: fmt.Appendf(nil, "k%d", i%97), Value: fmt.Appendf(nil, "job %d", i),
			Headers: []kgo.RecordHeader{{Key: "relay-event-id", Value: fmt.Appendf(nil, "%d", i)}}}, func(_ *kgo.Record, err error) {
			if err != nil {
				t.Errorf("produce: %v", err)
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	durableAt := map[recID]time.Time{}
	var violations []string
	deliveries := 0
	markDurable := func(id recID) {
		if _, ok := durableAt[id]; !ok {
			durableAt[id] = time.Now()
		}
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(durableAt)
	}

	member := e2e.Start(t, os.Args[0], []string{envTxnRole + "=share-member", envTxnAddr + "=" + addr})
	seen, byMember := 0, 0
	readMember := func() {
		lines := strings.Split(member.Output(), "\n")
		if len(lines) > 0 {
			lines = lines[:len(lines)-1] // the last may be incomplete
		}
		mu.Lock()
		defer mu.Unlock()
		for _, line := range lines[min(seen, len(lines)):] {
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			switch fields[0] {
			case "durable":
				byMember += len(fields) - 1
				for _, f := range fields[1:] {
					p, o, _ := strings.Cut(f, ":")
					pn, _ := strconv.Atoi(p)
					on, _ := strconv.ParseInt(o, 10, 64)
					markDurable(recID{int32(pn), on})
				}
			case "redelivered":
				violations = append(violations, "member process: "+line)
			}
		}
		seen = max(seen, len(lines))
	}

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if ctx.Err() != nil {
				saved, err := SavedShareGroups(dir)
				t.Fatalf("%s: %d of %d records durably accepted when the test timed out; saved share state %+v (%v)", what, count(), shareKillN, saved, err)
			}
			time.Sleep(50 * time.Millisecond) // condition poll: the member process reports through its output
			readMember()
		}
	}
	byIt := func(n int) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return byMember >= n
		}
	}
	// The second member joins once the first consumes, so both do.
	waitFor("the member process starting", byIt(1))
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- shareMember(mctx, addr, func(id recID) {
			mu.Lock()
			defer mu.Unlock()
			deliveries++
			if at, ok := durableAt[id]; ok {
				violations = append(violations, fmt.Sprintf("in-process member got %d:%d, durably accepted %v before", id.part, id.offset, time.Since(at)))
			}
		}, func(ids []recID) {
			mu.Lock()
			defer mu.Unlock()
			for _, id := range ids {
				markDurable(id)
			}
		})
	}()

	waitFor("before killing the member", byIt(1000))
	member.Kill()
	readMember()
	t.Logf("member process SIGKILLed at %d durable, %d of them by it", count(), byMember)
	atKill := count()
	waitFor("before killing the broker", func() bool { return count() >= min(atKill+1000, shareKillN-1000) })
	brokerProc.Kill()
	if n := count(); n >= shareKillN {
		t.Fatalf("all %d records were accepted before the broker was killed: the test proved nothing", n)
	}
	t.Logf("broker process SIGKILLed at %d durable", count())
	brokerProc = startBrokerProcess(t, ctx, dir, addr)
	// Done when the broker's saved share state has every record settled:
	// each partition's start offset at its end and no record in flight.
	// (An acceptance the broker saved just before being killed counts
	// although its member never heard back.)
	waitFor("after the restart", func() bool {
		saved, err := SavedShareGroups(dir)
		if err != nil || len(saved) != 1 {
			return false
		}
		var settled int64
		for _, p := range saved[0].Partitions {
			if p.Start != p.End || p.InFlight != 0 {
				return false
			}
			settled += p.End
		}
		return settled == shareKillN
	})
	stop()
	<-done

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d records durably accepted; the in-process member had %d deliveries", len(durableAt), deliveries)
	adm := kadm.NewClient(newKgo(t, addr))
	defer adm.Close()
	if ends, err := adm.ListEndOffsets(context.Background(), "dlq.jobs"); err == nil {
		ends.Each(func(o kadm.ListedOffset) {
			if o.Err == nil && o.Offset > 0 {
				t.Errorf("%d records went to the dead-letter topic: archived without being accepted", o.Offset)
			}
		})
	}
	brokerProc.Stop(30 * time.Second)
	if len(violations) > 0 {
		t.Fatalf("%d records delivered again after their acceptance was durable, first: %v", len(violations), violations[:min(5, len(violations))])
	}
}
