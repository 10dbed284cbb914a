package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/outboxrelay/relay/internal/broker/protocol"
)

func listenerUsersCommand() *command {
	return &command{
		name:    "listener-users",
		summary: "add, remove or list the Kafka listener's SASL users (a users file of SCRAM credentials)",
		sub: []*command{
			{name: "add", summary: "add a user, or change its password: --user NAME --password-file FILE (- for stdin)", run: listenerUsersAdd},
			{name: "remove", summary: "remove a user: --user NAME", run: listenerUsersRemove},
			{name: "list", summary: "list the users and their mechanisms", run: listenerUsersList},
		},
	}
}

// usersFileFlag registers --users-file, the file `relay run
// --listener-users-file` reads.
func usersFileFlag(fs *flag.FlagSet) *string {
	return fs.String("users-file", "", "the users file (the one given to relay run --listener-users-file)")
}

func readUsersForEdit(path string) (map[string]map[string]protocol.Credential, error) {
	if path == "" {
		return nil, usagef("--users-file is required")
	}
	users, err := protocol.ReadUsers(path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]map[string]protocol.Credential{}, nil
	}
	return users, err
}

// readPassword reads the first line of path ("-": standard input): never
// a flag, which would show in the process list and shell history.
func readPassword(path string) (string, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return "", fmt.Errorf("--password-file: %w", err)
		}
		defer f.Close()
		r = f
	}
	b, err := io.ReadAll(io.LimitReader(r, 64<<10))
	if err != nil {
		return "", fmt.Errorf("--password-file: %w", err)
	}
	pw, _, _ := strings.Cut(string(b), "\n")
	pw = strings.TrimSuffix(pw, "\r")
	if pw == "" {
		return "", usagef("--password-file: the password is empty")
	}
	return pw, nil
}

func listenerUsersAdd(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay listener-users add", stdio)
	path := usersFileFlag(fs)
	user := fs.String("user", "", "user name")
	pwFile := fs.String("password-file", "", "file whose first line is the password (- reads standard input)")
	iterations := fs.Int("iterations", 8192, fmt.Sprintf("SCRAM iterations (at least %d)", protocol.MinSCRAMIterations))
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	if err := protocol.ValidUserName(*user); err != nil {
		return usagef("--user: %v", err)
	}
	if *pwFile == "" {
		return usagef("--password-file is required (- reads standard input)")
	}
	if *iterations < protocol.MinSCRAMIterations {
		return usagef("--iterations %d: at least %d", *iterations, protocol.MinSCRAMIterations)
	}
	users, err := readUsersForEdit(*path)
	if err != nil {
		return err
	}
	pw, err := readPassword(*pwFile)
	if err != nil {
		return err
	}
	creds := map[string]protocol.Credential{}
	for _, m := range protocol.SCRAMMechanisms {
		if creds[m], err = protocol.NewCredential(m, pw, *iterations); err != nil {
			return err
		}
	}
	_, existed := users[*user]
	users[*user] = creds
	if err := protocol.WriteUsers(*path, users); err != nil {
		return err
	}
	verb := "added"
	if existed {
		verb = "changed the password of"
	}
	fmt.Fprintf(stdio.Stdout, "%s user %s (%s)\n", verb, *user, strings.Join(protocol.SCRAMMechanisms, ", "))
	return nil
}

func listenerUsersRemove(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay listener-users remove", stdio)
	path := usersFileFlag(fs)
	user := fs.String("user", "", "user name")
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	users, err := readUsersForEdit(*path)
	if err != nil {
		return err
	}
	if _, ok := users[*user]; !ok {
		return fmt.Errorf("no user %q in %s", *user, *path)
	}
	delete(users, *user)
	if err := protocol.WriteUsers(*path, users); err != nil {
		return err
	}
	fmt.Fprintf(stdio.Stdout, "removed user %s\n", *user)
	return nil
}

func listenerUsersList(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay listener-users list", stdio)
	path := usersFileFlag(fs)
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	users, err := readUsersForEdit(*path)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(users))
	for n := range users {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		var mechs []string
		for m := range users[n] {
			mechs = append(mechs, m)
		}
		slices.Sort(mechs)
		fmt.Fprintf(stdio.Stdout, "%s\t%s\n", n, strings.Join(mechs, ","))
	}
	return nil
}
