package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
)

// memberReport is what testdata/group_member.py writes when it ends.
type memberReport struct {
	Assigned     []float64      `json:"assigned"`
	Revoked      []float64      `json:"revoked"`
	CommitErrors [][]any        `json:"commit_errors"`
	IDs          map[string]int `json:"ids"`
	Closing      float64        `json:"closing"`
}

// TestGroupsSurviveARelayRestart: three librdkafka members of one consumer
// group (python3-confluent-kafka) read the log slowly through the Kafka
// listener, committing after each poll; the relay is stopped (SIGTERM) and
// started again, then SIGKILLed and started again. The group's membership
// is durable: after the restarts no member is assigned or revoked again,
// every commit once the relay is back is accepted, and no record is
// delivered twice to the group.
//
// franz-go members are not used here: franz-go ends its group session
// when a heartbeat cannot reach the coordinator, so it rejoins after any
// coordinator outage, and the leader's rejoin rebalances the group (in
// Kafka too); librdkafka keeps its assignment and retries.
func TestGroupsSurviveARelayRestart(t *testing.T) {
	t.Parallel()
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import confluent_kafka").CombinedOutput(); err != nil {
		t.Fatalf("the Python Kafka client is missing (apt-get install python3-confluent-kafka; .ci/run does): %v\n%s", err, out)
	}
	e := newEnv(t)
	kafkaAddr := e2e.FreeAddr(t)
	n := e.newNode("relay", "--kafka-addr", kafkaAddr, "--partitions", "6")
	n.start()
	e2e.WaitRole(t, n.proc, "leader", 30*time.Second)
	ledger := e2e.NewLedger()
	if err := e2e.Write(context.Background(), e.writers(4000), ledger); err != nil {
		t.Fatal(err)
	}
	e2e.WaitPublished(t, e.url, int64(ledger.Len()), time.Minute)

	script, _ := filepath.Abs("testdata/group_member.py")
	dir := t.TempDir()
	var procs []*exec.Cmd
	var outs []string
	for i := range 3 {
		out := filepath.Join(dir, fmt.Sprintf("member%d.json", i))
		cmd := exec.Command(python, script, kafkaAddr, "durable", "60", out)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs, outs = append(procs, cmd), append(outs, out)
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr))
	if err != nil {
		t.Fatal(err)
	}
	committed := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		offs, err := kadm.NewClient(adm).FetchOffsets(ctx, "durable")
		if err != nil {
			return 0
		}
		var sum int64
		offs.Each(func(o kadm.OffsetResponse) { sum += o.At })
		return sum
	}
	waitFor(t, time.Minute, "the group to commit", func() bool { return committed() > 300 })
	time.Sleep(3 * time.Second)
	settled := time.Now()
	var back []time.Time
	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		before := committed()
		if how == "SIGTERM" {
			n.stop()
		} else {
			n.proc.Kill()
			n.proc.Wait(time.Minute)
		}
		n.start()
		e2e.WaitRole(t, n.proc, "leader", 30*time.Second)
		back = append(back, time.Now())
		waitFor(t, time.Minute, "commits to go on after the "+how+" restart", func() bool { return committed() > before+200 })
	}
	adm.Close()
	for i, cmd := range procs {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	n.stop()

	all := map[string]int{}
	for i, out := range outs {
		raw, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var r memberReport
		if err := json.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		for _, at := range r.Assigned {
			if at > float64(settled.UnixNano())/1e9 {
				t.Errorf("member %d was assigned partitions again after the group settled: a rebalance", i)
			}
		}
		for _, at := range r.Revoked {
			if at > float64(settled.UnixNano())/1e9 && at < r.Closing {
				t.Errorf("member %d had partitions revoked after the group settled", i)
			}
		}
		for _, ce := range r.CommitErrors {
			at, _ := ce[0].(float64)
			for _, b := range back {
				if at > float64(b.Add(time.Second).UnixNano())/1e9 && at < float64(b.Add(5*time.Second).UnixNano())/1e9 {
					t.Errorf("member %d: a commit after the relay was back was refused: %v", i, ce[1])
				}
			}
		}
		for id, c := range r.IDs {
			all[id] += c
		}
	}
	twice := 0
	for _, c := range all {
		if c > 1 {
			twice++
		}
	}
	if twice > 0 {
		t.Errorf("%d of %d records were delivered to the group more than once", twice, len(all))
	}
	if len(all) < 1000 {
		t.Errorf("the group read only %d records", len(all))
	}
	t.Logf("%d records read by 3 librdkafka members across a SIGTERM and a SIGKILL restart of the relay; %d delivered twice", len(all), twice)
}
