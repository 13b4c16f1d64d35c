#!/bin/bash
# Supplement to this run (not the harness): seq-write / fsync-write on an image whose data
# block groups the kernel pre-allocated (fallocate 5G, removed by the target under test), so
# oleo, which cannot allocate data chunks yet, has room. Usage: precond.sh oleo|btrfs MiB [jobs]
# (jobs 0: seq-write with end_fsync; otherwise fsync-write 64k, fsync=1, MiB split over jobs).
T=$1; SIZE=${2:-4096}; JOBS=${3:-0}; B=/work/wt-bench/target/release/oleo
D=/work/wt-bench/bench/work/pre-$T; rm -rf $D; mkdir -p $D/mnt
truncate -s 8G $D/img; mkfs.btrfs -f -q $D/img >/dev/null 2>&1
dev=$(losetup --show -f --direct-io=on $D/img); mount -o ssd $dev $D/mnt; fallocate -l 5G $D/mnt/big; sync; umount $D/mnt
if [ $T = oleo ]; then losetup -d $dev; ($B mount -f -o rw,ssd $D/img $D/mnt > $D/log 2>&1; echo "daemon exit $?" >> $D/log) & sleep 2
else mount -o ssd $dev $D/mnt; fi
timeout 120 rm $D/mnt/big; echo "rm rc $?"; timeout 120 sync -f $D/mnt/; sync; echo 3 > /proc/sys/vm/drop_caches
if [ "$JOBS" = 0 ]; then
cat > $D/w.fio <<EOT
[seq-write]
rw=write
bs=1M
ioengine=psync
direct=0
end_fsync=1
fallocate=none
size=${SIZE}M
filename=$D/mnt/seq-write.bin
runtime=180
verify=crc32c
do_verify=0
verify_state_save=0
EOT
else
cat > $D/w.fio <<EOT
[fsync-write]
rw=write
fsync=1
fallocate=none
group_reporting=1
direct=0
bs=64k
ioengine=sync
size=$((SIZE / JOBS))M
directory=$D/mnt
numjobs=$JOBS
thread
runtime=120
verify=crc32c
do_verify=0
verify_state_save=0
EOT
fi
sed -e '/^size=/d' -e '/^runtime=/d' -e '/^end_fsync=/d' -e '/^fsync=/d' -e 's/do_verify=0/do_verify=1/' $D/w.fio > $D/v.fio; echo verify_only=1 >> $D/v.fio
s=$(date +%s.%N); (cd $D && timeout 300 fio --output-format=json --output=$D/w.json $D/w.fio); echo "fio rc $? wall $(echo "$(date +%s.%N) - $s" | bc)"
python3 -c "
import json; j=json.load(open('$D/w.json'))['jobs'][0]['write']; print('$T jobs=$JOBS', round(j['bw_bytes']/2**20,1), 'MiB/s', j['io_bytes']>>20, 'MiB', j['runtime'], 'ms')" 2>/dev/null
sync; echo 3 > /proc/sys/vm/drop_caches
(cd $D && timeout 300 fio --output-format=json --output=$D/v.json $D/v.fio); echo "verify rc $?"
python3 -c "
import json; j=json.load(open('$D/v.json'))['jobs'][0]['read']; print('verified', j['io_bytes']>>20, 'MiB at', round(j['bw_bytes']/2**20,1), 'MiB/s')" 2>/dev/null
if [ $T = oleo ]; then grep -q "$D/mnt" /proc/self/mountinfo && fusermount3 -u $D/mnt; wait; tail -3 $D/log; else umount $D/mnt; losetup -d $dev; fi
rm -rf $D
