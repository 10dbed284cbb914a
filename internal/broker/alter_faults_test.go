package broker

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

// TestAlterTopicConfigStorageFaults fails each step of the atomic
// meta.json write behind AlterTopicConfig (the temporary file's write, its
// fsync, the directory's fsync after the rename). The call returns the
// storage error and the topic keeps its old configuration in memory; a
// retry succeeds; after a machine crash at the failure (the files as far
// as they were fsynced) and after a plain reopen, meta.json holds the old
// configuration or, once the rename happened, the new one, never a torn
// file, and every record is there.
func TestAlterTopicConfigStorageFaults(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name     string
		rule     faultRule
		mayBeNew bool // the rename happened before the failure
	}{
		{"write", faultRule{op: opWrite, suffix: "meta.json.tmp", times: 1, err: syscall.ENOSPC}, false},
		{"fsync", faultRule{op: opSync, suffix: "meta.json.tmp", times: 1, err: syscall.EIO}, false},
		{"directory fsync", faultRule{op: opSyncDir, times: 1, err: syscall.EIO}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			fsys := newInjectFS()
			mod := func(o *Options) { o.FS = fsys }
			b := openWithTopic(t, dir, mod, "t", TopicConfig{Partitions: 2, RetentionMs: -1})
			for p := int32(0); p < 2; p++ {
				mustAppend(t, b, "t", p, EncodeBatch(-1, 0, 0, recs(fmt.Sprintf("p%d", p), 3)))
			}
			before, _ := b.Topic("t")
			want := before.Config
			want.RetentionBytes = 1 << 20

			rule := fsys.inject(c.rule)
			_, err := b.AlterTopicConfig("t", want)
			if rule.firedCount(fsys) != 1 {
				t.Fatalf("the fault did not fire")
			}
			if !errors.Is(err, c.rule.err) || !errors.Is(err, ErrStorage) {
				t.Fatalf("AlterTopicConfig under a failed %s: %v, want ErrStorage and %v", c.name, err, c.rule.err)
			}
			if got, _ := b.Topic("t"); got.Config != before.Config {
				t.Fatalf("a failed change altered the config in memory: %+v, was %+v", got.Config, before.Config)
			}
			crashed := fsys.crashCopy(t, dir)
			fsys.clear()

			check := func(when string, b *Broker) {
				t.Helper()
				got, err := b.Topic("t")
				if err != nil {
					t.Fatalf("%s: %v", when, err)
				}
				if got.Config != before.Config && (!c.mayBeNew || got.Config != want) {
					t.Fatalf("%s: config %+v, want the old %+v", when, got.Config, before.Config)
				}
				for p := int32(0); p < 2; p++ {
					if rs := readAll(t, b, "t", p); len(rs) != 3 {
						t.Fatalf("%s: partition %d has %d records, want 3", when, p, len(rs))
					}
				}
			}
			rb := openTest(t, crashed, nil)
			check("after a crash at the failure", rb)
			if err := rb.Close(); err != nil {
				t.Fatal(err)
			}

			if _, err := b.AlterTopicConfig("t", want); err != nil {
				t.Fatalf("the retry: %v", err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			b = openTest(t, dir, mod)
			if got, _ := b.Topic("t"); got.Config != want {
				t.Fatalf("after the retry and a reopen: config %+v, want %+v", got.Config, want)
			}
		})
	}
}
