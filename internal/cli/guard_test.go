package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A panic in a read-only command is one line and exit 1; in another
// command it stays a panic with Go's whole report.
func TestReadOnlyPanicIsOneLine(t *testing.T) {
	t.Parallel()
	var nilMap map[string]int
	boom := func(context.Context, IO, []string) error {
		nilMap["x"]++
		return nil
	}
	root := &command{name: "relay", sub: []*command{
		group("log", "", &command{name: "dump", run: boom, readOnly: true}),
		{name: "run", run: boom},
	}}
	var stdout, stderr bytes.Buffer
	code := dispatch(context.Background(), "relay", root, []string{"log", "dump"}, IO{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }})
	want := "relay: internal error in log dump: assignment to entry in nil map (please report)\n"
	if code != 1 || stderr.String() != want {
		t.Fatalf("exit %d, stderr %q, want exit 1 and %q", code, stderr.String(), want)
	}
	defer func() {
		if v := recover(); v == nil || !strings.Contains(v.(error).Error(), "nil map") {
			t.Fatalf("run: recovered %v, want its panic", v)
		}
	}()
	dispatch(context.Background(), "relay", root, []string{"run"}, IO{Stdout: &stdout, Stderr: &stderr, Getenv: func(string) string { return "" }})
	t.Fatal("run returned")
}
