package protocol

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/outboxrelay/relay/internal/broker"
)

// Credentials looks up the stored SCRAM credential of a user for a
// mechanism. An error means the store could not be read: authentication
// then fails for everyone (fail closed).
type Credentials interface {
	Credential(user, mechanism string) (Credential, bool, error)
}

// UsersFile is a Credentials kept in a text file, one credential a line:
//
//	name mechanism iterations salt stored-key server-key
//
// with the last three in standard base64, and # comments. The file holds
// no password. Credential re-reads the file when its size or modification
// time changed, so `relay listener-users add` and `remove` take effect on
// the next authentication without a restart; a file that became unreadable
// or malformed lets nobody in until it is fixed.
type UsersFile struct {
	path string

	mu    sync.Mutex
	size  int64
	mtime time.Time
	users map[string]map[string]Credential
	err   error
}

// OpenUsersFile reads path, which must exist.
func OpenUsersFile(path string) (*UsersFile, error) {
	u := &UsersFile{path: path}
	if err := u.reload(); err != nil {
		return nil, err
	}
	return u, nil
}

// Credential implements Credentials.
func (u *UsersFile) Credential(user, mechanism string) (Credential, bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if err := u.reload(); err != nil {
		return Credential{}, false, err
	}
	c, ok := u.users[user][mechanism]
	return c, ok, nil
}

// reload re-reads the file if it changed; u.mu is held (or u is new).
func (u *UsersFile) reload() error {
	st, err := os.Stat(u.path)
	if err != nil {
		u.users, u.err = nil, fmt.Errorf("protocol: users file: %w", err)
		return u.err
	}
	if u.users != nil && st.Size() == u.size && st.ModTime().Equal(u.mtime) {
		return nil
	}
	users, err := ReadUsers(u.path)
	if err != nil {
		u.users, u.err = nil, err
		return err
	}
	u.users, u.err, u.size, u.mtime = users, nil, st.Size(), st.ModTime()
	return nil
}

// ValidUserName reports a name the users file cannot hold: empty, longer
// than 255 bytes, or with spaces, control characters or '#'.
func ValidUserName(name string) error {
	if name == "" || len(name) > 255 {
		return errors.New("protocol: a user name has 1 to 255 bytes")
	}
	for _, r := range name {
		if unicode.IsSpace(r) || unicode.IsControl(r) || r == '#' {
			return fmt.Errorf("protocol: user name %q has a space, control character or '#'", name)
		}
	}
	return nil
}

// ReadUsers parses a users file into user -> mechanism -> credential. A
// malformed line is reported by number, never by content.
func ReadUsers(path string) (map[string]map[string]Credential, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("protocol: users file: %w", err)
	}
	users := map[string]map[string]Credential{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		bad := func(what string) error {
			return fmt.Errorf("protocol: users file %s line %d: %s", path, n, what)
		}
		if len(f) != 6 {
			return nil, bad("want 6 fields: name mechanism iterations salt stored-key server-key")
		}
		if ValidUserName(f[0]) != nil {
			return nil, bad("invalid user name")
		}
		h, err := scramHash(f[1])
		if err != nil {
			return nil, bad("unknown mechanism")
		}
		iter, err := strconv.Atoi(f[2])
		if err != nil || iter < MinSCRAMIterations {
			return nil, bad(fmt.Sprintf("iterations must be a number of at least %d", MinSCRAMIterations))
		}
		var keys [3][]byte
		for i := range keys {
			if keys[i], err = base64.StdEncoding.DecodeString(f[3+i]); err != nil {
				return nil, bad("salt and keys must be standard base64")
			}
		}
		if len(keys[0]) == 0 || len(keys[1]) != h().Size() || len(keys[2]) != h().Size() {
			return nil, bad("key of the wrong size for the mechanism")
		}
		if users[f[0]] == nil {
			users[f[0]] = map[string]Credential{}
		}
		users[f[0]][f[1]] = Credential{Mechanism: f[1], Iterations: iter, Salt: keys[0], StoredKey: keys[1], ServerKey: keys[2]}
	}
	return users, sc.Err()
}

// WriteUsers replaces path with users, atomically (a temporary file renamed
// over it, mode 0600, with broker.WriteFileAtomic).
func WriteUsers(path string, users map[string]map[string]Credential) error {
	var b strings.Builder
	b.WriteString("# relay Kafka listener users: name mechanism iterations salt stored-key server-key\n")
	names := make([]string, 0, len(users))
	for n := range users {
		names = append(names, n)
	}
	slices.Sort(names)
	enc := base64.StdEncoding.EncodeToString
	for _, n := range names {
		mechs := make([]string, 0, len(users[n]))
		for m := range users[n] {
			mechs = append(mechs, m)
		}
		slices.Sort(mechs)
		for _, m := range mechs {
			c := users[n][m]
			fmt.Fprintf(&b, "%s %s %d %s %s %s\n", n, m, c.Iterations, enc(c.Salt), enc(c.StoredKey), enc(c.ServerKey))
		}
	}
	if err := broker.WriteFileAtomic(broker.OSFS{}, path, []byte(b.String()), 0o600); err != nil {
		return fmt.Errorf("protocol: writing users file: %w", err)
	}
	return nil
}
