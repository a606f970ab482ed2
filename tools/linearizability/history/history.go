// Package history reads FAWN client histories (JSON lines) and checks them for per-key
// linearizability against a key-value register model with Porcupine.
//
// One operation per line:
//
//		{"client":0,"op":"put","key":"k1","value":"v-0-17","output":null,"ok":true,"call":120,"return":450}
//
//	  - op: "get", "put", "delete" or "cas".
//	  - value: the value a put or cas writes (unique per write, so a read names the write it
//	    saw).
//	  - expect: for a cas, the value its unique was read with (values are unique per write,
//	    so "the item is still the one read" is "the key still holds this value").
//	  - output: for a get, the value read or null for a miss; for a delete, "deleted" (the key
//	    existed), "not_found" (it did not) or null (not checked); for a cas, "stored",
//	    "exists" (the key holds another value), "not_found" or null; ignored for a put.
//	  - ok: true (returned with this output), false (failed with no effect: the operation is
//	    dropped) or "unknown" (timed out or failed ambiguously: it may or may not have taken
//	    effect; its return time is taken as +infinity and its output is ignored).
//	  - call, return: nanoseconds from one monotonic clock shared by every client.
package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Outcome of an operation as recorded.
type Outcome int

const (
	// Failed: the operation had no effect (dropped before checking).
	Failed Outcome = iota
	// Ok: the operation returned its output.
	Ok
	// Unknown: the operation may or may not have taken effect.
	Unknown
)

// Record is one line of a history file.
type Record struct {
	Client int     `json:"client"`
	Op     string  `json:"op"`
	Key    string  `json:"key"`
	Value  *string `json:"value"`
	Expect *string `json:"expect"`
	Output *string `json:"output"`
	Ok     Outcome `json:"-"`
	Call   int64   `json:"call"`
	Return int64   `json:"return"`
	Line   int     `json:"-"`
}

// UnmarshalJSON accepts ok as true, false or "unknown".
func (r *Record) UnmarshalJSON(data []byte) error {
	type plain Record
	var raw struct {
		plain
		Ok json.RawMessage `json:"ok"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	*r = Record(raw.plain)
	switch strings.TrimSpace(string(raw.Ok)) {
	case "true":
		r.Ok = Ok
	case "false":
		r.Ok = Failed
	case `"unknown"`:
		r.Ok = Unknown
	default:
		return fmt.Errorf(`"ok" must be true, false or "unknown", got %s`, string(raw.Ok))
	}
	return nil
}

// Input is what an operation asked for (the model's input).
type Input struct {
	Op     string
	Key    string
	Value  string
	Expect string
}

// Output is what an operation returned (the model's output).
type Output struct {
	// Unknown: the outcome was not observed; the output is not checked.
	Unknown bool
	// Present: for a get, whether a value was returned; for a delete, whether the key existed.
	Present bool
	// Checked: for a delete or a cas, whether its result was observed.
	Checked bool
	Value   string
	// CasResult: for a checked cas, "stored", "exists" or "not_found".
	CasResult string
}

// State is the model state of one key.
type State struct {
	Present bool
	Value   string
}

// Parse reads a JSON-lines history. Blank lines are skipped.
func Parse(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<26)
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var rec Record
		if err := json.Unmarshal([]byte(text), &rec); err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		rec.Line = line
		if err := rec.validate(); err != nil {
			return nil, fmt.Errorf("line %d: %v", line, err)
		}
		out = append(out, rec)
	}
	return out, sc.Err()
}

func (r *Record) validate() error {
	switch r.Op {
	case "get", "delete":
	case "put":
		if r.Value == nil {
			return fmt.Errorf("put without a value")
		}
	case "cas":
		if r.Value == nil || r.Expect == nil {
			return fmt.Errorf("cas without a value or an expected value")
		}
		if r.Output != nil && *r.Output != "stored" && *r.Output != "exists" && *r.Output != "not_found" {
			return fmt.Errorf(`cas output must be "stored", "exists", "not_found" or null, got %q`, *r.Output)
		}
	default:
		return fmt.Errorf("unknown op %q", r.Op)
	}
	if r.Client < 0 {
		return fmt.Errorf("negative client id")
	}
	if r.Op == "delete" && r.Output != nil && *r.Output != "deleted" && *r.Output != "not_found" {
		return fmt.Errorf(`delete output must be "deleted", "not_found" or null, got %q`, *r.Output)
	}
	if r.Ok != Unknown && r.Return < r.Call {
		return fmt.Errorf("returns (%d) before it is called (%d)", r.Return, r.Call)
	}
	return nil
}

// Operations turns records into Porcupine operations: failed operations are dropped, and so
// are gets of unknown outcome (a read with no result constrains nothing); an unknown update
// returns at +infinity.
func Operations(records []Record) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(records))
	for _, r := range records {
		if r.Ok == Failed || (r.Ok == Unknown && r.Op == "get") {
			continue
		}
		in := Input{Op: r.Op, Key: r.Key}
		if r.Value != nil {
			in.Value = *r.Value
		}
		if r.Expect != nil {
			in.Expect = *r.Expect
		}
		var out Output
		ret := r.Return
		if r.Ok == Unknown {
			out.Unknown = true
			ret = math.MaxInt64
		} else {
			switch r.Op {
			case "get":
				if r.Output != nil {
					out.Present = true
					out.Value = *r.Output
				}
			case "delete":
				if r.Output != nil {
					out.Checked = true
					out.Present = *r.Output == "deleted"
				}
			case "cas":
				if r.Output != nil {
					out.Checked = true
					out.CasResult = *r.Output
				}
			}
		}
		ops = append(ops, porcupine.Operation{
			ClientId: r.Client,
			Input:    in,
			Call:     r.Call,
			Output:   out,
			Return:   ret,
			Metadata: fmt.Sprintf("line %d", r.Line),
		})
	}
	return ops
}

// partitionByKey groups operations by key, keys in sorted order.
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[string][]porcupine.Operation{}
	for _, op := range history {
		k := op.Input.(Input).Key
		byKey[k] = append(byKey[k], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// partitionEventsByKey groups events by the key of their operation (a return event is put
// with its call, matched by id).
func partitionEventsByKey(history []porcupine.Event) [][]porcupine.Event {
	keyOf := map[int]string{}
	byKey := map[string][]porcupine.Event{}
	var keys []string
	for _, ev := range history {
		var k string
		if ev.Kind == porcupine.CallEvent {
			k = ev.Value.(Input).Key
			keyOf[ev.Id] = k
		} else {
			k = keyOf[ev.Id]
		}
		if _, seen := byKey[k]; !seen {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], ev)
	}
	sort.Strings(keys)
	out := make([][]porcupine.Event, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// Model is the per-key register with delete: the state of a partition is one key's value
// or its absence. A put always succeeds; a get must return the current value (or miss when
// absent); a delete removes the key and, when its result was observed, must say whether
// the key existed. An operation of unknown outcome may take effect at any point after its
// call (or never, if it is never linearized before the end of the history).
var Model = porcupine.Model{
	Partition:      partitionByKey,
	PartitionEvent: partitionEventsByKey,
	Init:           func() interface{} { return State{} },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		st := state.(State)
		in := input.(Input)
		out := output.(Output)
		switch in.Op {
		case "put":
			return true, State{Present: true, Value: in.Value}
		case "delete":
			if !out.Unknown && out.Checked && out.Present != st.Present {
				return false, st
			}
			return true, State{}
		case "cas":
			matches := st.Present && st.Value == in.Expect
			if !out.Unknown && out.Checked {
				want := "exists"
				switch {
				case !st.Present:
					want = "not_found"
				case matches:
					want = "stored"
				}
				if out.CasResult != want {
					return false, st
				}
			}
			if matches {
				return true, State{Present: true, Value: in.Value}
			}
			return true, st
		default: // get
			if out.Unknown {
				return true, st
			}
			if out.Present != st.Present || (out.Present && out.Value != st.Value) {
				return false, st
			}
			return true, st
		}
	},
	Equal: func(a, b interface{}) bool { return a.(State) == b.(State) },
	DescribeOperation: func(input, output interface{}) string {
		in := input.(Input)
		out := output.(Output)
		res := ""
		switch {
		case out.Unknown:
			res = "?"
		case in.Op == "get" && out.Present:
			res = fmt.Sprintf("%q", out.Value)
		case in.Op == "get":
			res = "miss"
		case in.Op == "delete" && out.Checked && out.Present:
			res = "deleted"
		case in.Op == "delete" && out.Checked:
			res = "not_found"
		case in.Op == "cas" && out.Checked:
			res = out.CasResult
		default:
			res = "ok"
		}
		switch in.Op {
		case "put":
			return fmt.Sprintf("put(%q, %q) -> %s", in.Key, in.Value, res)
		case "cas":
			return fmt.Sprintf("cas(%q, %q if %q) -> %s", in.Key, in.Value, in.Expect, res)
		default:
			return fmt.Sprintf("%s(%q) -> %s", in.Op, in.Key, res)
		}
	},
	DescribeState: func(state interface{}) string {
		st := state.(State)
		if !st.Present {
			return "absent"
		}
		return fmt.Sprintf("%q", st.Value)
	},
}

// KeyResult is the verdict for one key.
type KeyResult struct {
	Key        string
	Operations int
	Result     porcupine.CheckResult
}

// Report is the verdict for a whole history.
type Report struct {
	Operations int
	Unknown    int
	Keys       []KeyResult
	// Warnings: things that weaken the check (e.g. a value written by two puts).
	Warnings []string
}

// Illegal lists the keys whose sub-history is not linearizable.
func (r *Report) Illegal() []string {
	var out []string
	for _, k := range r.Keys {
		if k.Result == porcupine.Illegal {
			out = append(out, k.Key)
		}
	}
	return out
}

// TimedOut lists the keys whose check did not finish in time.
func (r *Report) TimedOut() []string {
	var out []string
	for _, k := range r.Keys {
		if k.Result == porcupine.Unknown {
			out = append(out, k.Key)
		}
	}
	return out
}

// Check checks every key's sub-history separately, each with `perKey` as its time budget
// (0 = unlimited).
func Check(records []Record, perKey time.Duration) Report {
	ops := Operations(records)
	rep := Report{Operations: len(ops)}
	seen := map[string]int{}
	for _, r := range records {
		if r.Ok == Unknown && r.Op != "get" {
			rep.Unknown++
		}
		if r.Op == "put" || r.Op == "cas" {
			k := r.Key + "\x00" + *r.Value
			if prev, dup := seen[k]; dup {
				rep.Warnings = append(rep.Warnings,
					fmt.Sprintf("lines %d and %d put the same value %q to key %q", prev, r.Line, *r.Value, r.Key))
			}
			seen[k] = r.Line
		}
	}
	for _, part := range partitionByKey(ops) {
		key := part[0].Input.(Input).Key
		res := porcupine.CheckOperationsTimeout(Model, part, perKey)
		rep.Keys = append(rep.Keys, KeyResult{Key: key, Operations: len(part), Result: res})
	}
	return rep
}

// Visualize writes Porcupine's HTML visualization of the operations on `keys` (all keys
// if empty) to `path`.
func Visualize(records []Record, keys []string, path string, timeout time.Duration) error {
	ops := Operations(records)
	if len(keys) > 0 {
		want := map[string]bool{}
		for _, k := range keys {
			want[k] = true
		}
		kept := ops[:0]
		for _, op := range ops {
			if want[op.Input.(Input).Key] {
				kept = append(kept, op)
			}
		}
		ops = kept
	}
	_, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	return porcupine.VisualizePath(Model, info, path)
}
