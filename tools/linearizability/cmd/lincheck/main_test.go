package main

import (
	"os"
	"path/filepath"
	"testing"
)

func write(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "h.jsonl")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestExitCodes(t *testing.T) {
	good := write(t, `{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":11,"return":20}
`)
	if code := run(good, "", 0); code != 0 {
		t.Errorf("linearizable history: exit %d", code)
	}
	stale := write(t, `{"client":0,"op":"put","key":"a","value":"a1","output":null,"ok":true,"call":0,"return":10}
{"client":0,"op":"put","key":"a","value":"a2","output":null,"ok":true,"call":11,"return":20}
{"client":1,"op":"get","key":"a","value":null,"output":"a1","ok":true,"call":21,"return":30}
`)
	viz := filepath.Join(t.TempDir(), "v.html")
	if code := run(stale, viz, 0); code != 1 {
		t.Errorf("stale read: exit %d", code)
	}
	if _, err := os.Stat(viz); err != nil {
		t.Errorf("no visualization written: %v", err)
	}
	if code := run(write(t, "garbage\n"), "", 0); code != 2 {
		t.Errorf("bad input: exit %d", code)
	}
	if code := run(filepath.Join(t.TempDir(), "missing"), "", 0); code != 2 {
		t.Errorf("missing file: exit %d", code)
	}
}
