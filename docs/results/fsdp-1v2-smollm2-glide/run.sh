#!/bin/bash
cd /work/main
D=/work/fsdp_run
COMMON="--target smollm2 --data /work/smol_data/distill-chat --preset xs --target-layers 18 --steps 120 --batch-size 16 --eval-every 40 --no-progress"
date +%s > $D/t0
# FSDP, 2 processes, interrupted after its step-40 checkpoint, then resumed
.venv/bin/hf-cascade train glide $COMMON --out $D/fsdp --num-processes 2 --fsdp --threads 1 --checkpoint-every 40 > $D/fsdp.log 2>&1 &
P=$!
while [ ! -d $D/fsdp/checkpoint ]; do sleep 5; if ! kill -0 $P 2>/dev/null; then break; fi; done
sleep 60
pkill -INT -f "hf_cascade.cli train glide" ; sleep 2; pkill -f "hf_cascade.cli train glide"; pkill -f "accelerate.commands.launch"
wait $P; echo "interrupted rc=$?" >> $D/fsdp.log
date +%s > $D/t_cut
.venv/bin/hf-cascade train glide $COMMON --out $D/fsdp --num-processes 2 --fsdp --threads 1 --checkpoint-every 40 --resume > $D/fsdp-resume.log 2>&1
echo "resume rc=$?" >> $D/fsdp-resume.log; date +%s > $D/t_fsdp
.venv/bin/hf-cascade train glide $COMMON --out $D/ddp --num-processes 2 --threads 1 > $D/ddp.log 2>&1
echo "rc=$?" >> $D/ddp.log; date +%s > $D/t_ddp
.venv/bin/hf-cascade train glide $COMMON --out $D/one --grad-accum 2 --threads 2 > $D/one.log 2>&1
echo "rc=$?" >> $D/one.log; date +%s > $D/t_one
echo done > $D/done
