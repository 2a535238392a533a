package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/toolgate/toolgate/api"
	"github.com/toolgate/toolgate/internal/auditchain"
)

// receiptCmd: toolgate receipt get ID | verify FILE --key K [--result R]
func (a *app) receiptCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "receipt", Short: "A call's signed receipt: fetch it with its proof, check it offline", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() }}
	cmd.AddCommand(a.receiptGetCmd(), a.receiptVerifyCmd())
	return cmd
}

// receiptGetCmd: toolgate receipt get ID [--wait D]
func (a *app) receiptGetCmd() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "get ID",
		Short: "Print an ended call's signed receipt and, once a checkpoint covers it, its inclusion proof",
		Long: `Print an ended call's signed receipt as JSON: {"receipt", "proof"}. The proof
(as audit prove prints it) comes once the next checkpoint covers the call's
terminal audit event; until then "pending" says why there is none, and with
--wait the command asks again until the proof is there or the time is up
(exit 5). An agent gets its own calls' receipts, with the proof under the
checkpoint's signed head alone (its listing names other calls); auditors and
operators any, with the whole checkpoint.`,
		Example: `  toolgate receipt get "$ID" --wait 30s > receipt.json
  toolgate receipt verify receipt.json --key audit-chain.pub`,
		Args: exactArgs(1, "an invocation id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			tenant, c, closeFn, err := a.tenantClient()
			if err != nil {
				return err
			}
			defer closeFn()
			deadline := time.Now().Add(wait)
			for {
				r, err := c.Receipt(cmd.Context(), tenant, args[0])
				if err != nil {
					return err
				}
				if len(r.Proof) > 0 || wait == 0 {
					return a.printJSON(r)
				}
				if time.Now().After(deadline) {
					if err := a.printJSON(r); err != nil {
						return err
					}
					return &codeError{code: exitTimeout, err: fmt.Errorf("no proof of the receipt of %s yet: %s", args[0], r.Pending)}
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(500 * time.Millisecond):
				}
			}
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the proof (a checkpoint comes every few seconds)")
	return cmd
}

// receiptVerifyCmd: toolgate receipt verify FILE --key K [--result R]
func (a *app) receiptVerifyCmd() *cobra.Command {
	var key, result string
	cmd := &cobra.Command{
		Use:   "verify FILE",
		Short: "Check a receipt offline: its signature, the result's hash, and its proof; exit 0 only when all hold",
		Long: `Check a receipt (receipt get's output, or a bare receipt as an MCP result's
_meta carries it) with the public audit chain key alone: the signature; with
--result, that the file holds the result the receipt names (the response's
result member, as JSON); and when the file has a proof, that it proves the
receipt's terminal audit event under a signed checkpoint and that this event
carries the same receipt. A receipt changed (E3960), another result (E3961),
a proof of another event (E3962), a changed checkpoint (E3965), a proof for another tree (E3966),
a listing that is not the one its checkpoint signs (E3967) or a file that is no receipt (E3963)
exits non-zero (docs/audit.md).`,
		Example: `  toolgate receipt verify receipt.json --key audit-chain.pub
  toolgate receipt verify receipt.json --key audit-chain.pub --result result.json`,
		Args: exactArgs(1, "FILE"),
		RunE: func(cmd *cobra.Command, args []string) error {
			pub, err := a.chainKey(key)
			if err != nil {
				return err
			}
			b, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			rr, err := readReceipt(b)
			if err != nil {
				return err
			}
			r := rr.Receipt
			if err := auditchain.CheckReceipt(r, pub); err != nil {
				return err
			}
			checked := "signature"
			if result != "" {
				res, err := os.ReadFile(result)
				if err != nil {
					return err
				}
				if err := auditchain.CheckReceiptResult(r, res); err != nil {
					return err
				}
				checked += ", result"
			}
			if len(rr.Proof) > 0 {
				var p auditchain.Proof
				if err := json.Unmarshal(rr.Proof, &p); err != nil {
					return api.NewError(api.InvalidParameters, api.EReceiptMalformed, "%s: the proof is not one: %v", args[0], err)
				}
				if err := auditchain.CheckReceiptProof(r, &p, pub); err != nil {
					return err
				}
				checked += fmt.Sprintf(", proof (AUDIT seq %d, checkpoint %d)", p.Seq, p.CheckpointSeq)
			}
			_, err = fmt.Fprintf(a.stdout, "receipt of %s (%s, %s) verifies: %s\n", r.InvocationID, r.Status, r.EventID, checked)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&key, "key", "", "the public audit chain key (audit-chain.pub); default: the data directory's")
	f.StringVar(&result, "result", "", "a file holding the result to check against the receipt's hash")
	return cmd
}

// readReceipt reads receipt get's output ({"receipt","proof"}) or a bare
// receipt.
func readReceipt(b []byte) (api.ReceiptResponse, error) {
	var rr api.ReceiptResponse
	malformed := func(err error) error {
		return api.NewError(api.InvalidParameters, api.EReceiptMalformed, "not a receipt: %v", err)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&rr); err != nil {
		return rr, malformed(err)
	}
	if rr.Receipt == nil {
		var r api.Receipt
		if err := json.Unmarshal(b, &r); err != nil {
			return rr, malformed(err)
		}
		rr.Receipt = &r
	}
	if rr.Receipt.InvocationID == "" || rr.Receipt.Sig == "" {
		return rr, malformed(errors.New("no invocation_id or sig"))
	}
	return rr, nil
}
