#!/usr/bin/env python

#/************************************************************
#*
#* Licensed to the Apache Software Foundation (ASF) under one
#* or more contributor license agreements.  See the NOTICE file
#* distributed with this work for additional information
#* regarding copyright ownership.  The ASF licenses this file
#* to you under the Apache License, Version 2.0 (the
#* "License"); you may not use this file except in compliance
#* with the License.  You may obtain a copy of the License at
#*
#*   http://www.apache.org/licenses/LICENSE-2.0
#*
#* Unless required by applicable law or agreed to in writing,
#* software distributed under the License is distributed on an
#* "AS IS" BASIS, WITHOUT WARRANTIES OR CONDITIONS OF ANY
#* KIND, either express or implied.  See the License for the
#* specific language governing permissions and limitations
#* under the License.
#*
#*************************************************************/
# Ported from SINGA 0.3's tool/python/examples/train_mnist.py to Python 3 (print statements; the
# data read from Debian's Fashion-MNIST IDX files; no SWIG Driver to initialise).

'''
Example script of MLP model for MNIST dataset
'''
import os, sys
import numpy as np

from singa.io.idx import read_idx
from singa.layer import *
from singa.model import *

def load_dataset():
    ''' MNIST dataset (here Debian's Fashion-MNIST, in MNIST's IDX format)
    '''
    print('[Load MNIST dataset]')
    folder = "/usr/share/datasets/fashion-mnist"
    x = read_idx(folder + "/train-images-idx3-ubyte.gz")
    x = x.reshape(x.shape[0], -1)
    print('   data x:', x.shape)
    y = read_idx(folder + "/train-labels-idx1-ubyte.gz").reshape(-1, 1)
    print('  label y:', y.shape)

    return x, y

#-------------------------------------------------------------------
print('[Layer registration/declaration]')

input = ImageInput(28, 28)
label = LabelInput()

nn = []
nn.append(input)
nn.append(Dense(2500, init='uniform'))
nn.append(Activation('stanh'))
nn.append(Dense(2000, init='uniform'))
nn.append(Activation('stanh'))
nn.append(Dense(1500, init='uniform'))
nn.append(Activation('stanh'))
nn.append(Dense(1000, init='uniform'))
nn.append(Activation('stanh'))
nn.append(Dense(500, init='uniform'))
nn.append(Activation('stanh'))
nn.append(Dense(10, init='uniform'))
loss = Loss('softmaxloss')

# updater
sgd = SGD(lr=0.001, lr_type='step')

#-------------------------------------------------------------------
batchsize = 64 
disp_freq = 10

x, y = load_dataset()

print('[Start training]')
for i in range(x.shape[0] // batchsize):
    xb, yb = x[i*batchsize:(i+1)*batchsize,:], y[i*batchsize:(i+1)*batchsize,:]
    nn[0].Feed(xb)
    label.Feed(yb)
    for h in range(1, len(nn)):
        nn[h].ComputeFeature(nn[h-1])
    loss.ComputeFeature(nn[-1], label)
    if (i+1)%disp_freq == 0:
        print('  Step {:>3}: '.format(i+1), end=" ")
        loss.display()

    loss.ComputeGradient()
    for h in range(len(nn)-1, 0, -1):
        nn[h].ComputeGradient()
        sgd.Update(i+1, nn[h])

