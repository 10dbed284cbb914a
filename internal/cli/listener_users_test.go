package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outboxrelay/relay/internal/broker/protocol"
)

// TestListenerUsersCommand: `relay listener-users add` stores SCRAM
// credentials (never the password) that verify the password, `list`
// shows the user, `remove` takes it out; bad input is refused with a clear
// error and no change.
func TestListenerUsersCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	users, pwFile := filepath.Join(dir, "users"), filepath.Join(dir, "pw")
	const pw = "s3cret-listener-password"
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := relay(t, nil, "listener-users", "add", "--users-file", users, "--user", "alice", "--password-file", pwFile); r.Code != 0 {
		t.Fatalf("add: %d %s", r.Code, r.Stderr)
	}
	data, err := os.ReadFile(users)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), pw) {
		t.Fatal("the users file holds the password")
	}
	st, _ := os.Stat(users)
	if st.Mode().Perm() != 0o600 {
		t.Errorf("users file mode %v, want 0600", st.Mode().Perm())
	}
	got, err := protocol.ReadUsers(users)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range protocol.SCRAMMechanisms {
		c, ok := got["alice"][m]
		if !ok || !c.Verify(pw) || c.Verify("other") {
			t.Errorf("alice's %s credential does not verify the password (present %v)", m, ok)
		}
	}
	r := relay(t, nil, "listener-users", "list", "--users-file", users)
	if r.Code != 0 || !strings.Contains(r.Stdout, "alice\tSCRAM-SHA-256,SCRAM-SHA-512") {
		t.Errorf("list: %d %q %s", r.Code, r.Stdout, r.Stderr)
	}
	for _, bad := range [][]string{
		{"add", "--users-file", users, "--user", "bad name", "--password-file", pwFile},
		{"add", "--users-file", users, "--user", "bob"},
		{"add", "--users-file", users, "--user", "bob", "--password-file", pwFile, "--iterations", "10"},
		{"add", "--user", "bob", "--password-file", pwFile},
		{"remove", "--users-file", users, "--user", "nobody"},
	} {
		r := relay(t, nil, append([]string{"listener-users"}, bad...)...)
		if r.Code == 0 || r.Stderr == "" {
			t.Errorf("%v: exit %d, stderr %q", bad, r.Code, r.Stderr)
		}
		if strings.Contains(r.Stderr+r.Stdout, pw) {
			t.Errorf("%v: output shows the password", bad)
		}
	}
	if after, _ := os.ReadFile(users); string(after) != string(data) {
		t.Error("a refused command changed the users file")
	}
	if r := relay(t, nil, "listener-users", "remove", "--users-file", users, "--user", "alice"); r.Code != 0 {
		t.Fatalf("remove: %d %s", r.Code, r.Stderr)
	}
	if got, _ := protocol.ReadUsers(users); len(got) != 0 {
		t.Errorf("after remove: %v", got)
	}
}
